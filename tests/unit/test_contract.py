"""A DAG's contract: every field validated, stored only when declared, read back; `my_dag()`."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from treadle import Dataset, dag, task
from treadle.authoring.loader import load_folder
from treadle.domain.contract import Criticality, DagContract
from treadle.domain.dag_version import DagStructure
from treadle.errors import DagDefinitionError


@task
def produce() -> int:
    return 1


@task(outlets=[Dataset("warehouse.b"), Dataset("warehouse.a")])
def publish() -> int:
    return 2


def build(**contract: Any) -> Any:
    @dag(dag_id="contracted", **contract)
    def contracted() -> None:
        publish()

    return contracted


def test_every_field_is_stored_and_read_back() -> None:
    d = build(
        purpose="Daily sales for finance",
        criticality="High",
        inlets=[Dataset("raw.orders"), "raw.refunds"],
        outlets=["warehouse.extra"],
        freshness_slo=timedelta(hours=26),
        failure_impact="the finance dashboard is a day behind",
        runbook_url="https://wiki.example.com/runbooks/sales?x=1#top",
        manual_runs=False,
        backfills=False,
    )
    c = d.structure().contract
    assert c == DagContract(
        purpose="Daily sales for finance",
        criticality=Criticality.HIGH,
        inlets=("raw.orders", "raw.refunds"),
        outlets=("warehouse.extra",),
        freshness_slo_s=26 * 3600.0,
        failure_impact="the finance dashboard is a day behind",
        runbook_url="https://wiki.example.com/runbooks/sales?x=1#top",
        manual_runs=False,
        backfills=False,
    )
    stored = json.loads(json.dumps(d.structure().to_json()))
    assert DagStructure.from_json(stored) == d.structure()
    assert stored["contract"]["criticality"] == "high"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(timedelta(minutes=90), 5400.0), (3600, 3600.0), (0.5, 0.5), ("6h", 21600.0), (" 2D ", 172800.0)],
)
def test_freshness_slo_takes_a_timedelta_seconds_or_text(given: object, seconds: float) -> None:
    assert build(freshness_slo=given).structure().contract.freshness_slo_s == seconds


@pytest.mark.parametrize(
    ("contract", "message"),
    [
        ({"purpose": 42}, "purpose must be text, got int"),
        ({"purpose": "x" * 2001}, "purpose must be at most 2000 characters"),
        ({"failure_impact": ["x"]}, "failure_impact must be text, got list"),
        ({"criticality": "urgent"}, "criticality must be one of low, medium, high, critical, got 'urgent'"),
        ({"criticality": 3}, "criticality must be one of low, medium, high, critical, got 3"),
        ({"inlets": "raw.orders"}, "inlets must be a list of Dataset"),
        ({"inlets": ["has space"]}, "dataset name 'has space' must be 1-500 URI characters"),
        ({"outlets": [3]}, "outlets: expected a Dataset, got 3"),
        ({"freshness_slo": 0}, "freshness_slo must be more than 0 s and at most 366 days, got 0 s"),
        ({"freshness_slo": timedelta(days=-1)}, "freshness_slo must be more than 0 s"),
        ({"freshness_slo": timedelta(days=400)}, "at most 366 days"),
        ({"freshness_slo": "soon"}, "freshness_slo: invalid duration 'soon'"),
        ({"freshness_slo": True}, "freshness_slo must be a timedelta, seconds or text"),
        (
            {"runbook_url": "ftp://files.example.com/runbook"},
            "runbook_url must be an http(s) URL with a host",
        ),
        ({"runbook_url": "https://"}, "runbook_url must be an http(s) URL with a host"),
        ({"runbook_url": "wiki/runbook"}, "runbook_url must be an http(s) URL with a host"),
        ({"runbook_url": "https://wiki.example.com/run book"}, "without spaces"),
        ({"runbook_url": "https://[::1"}, "runbook_url must be an http(s) URL with a host"),
        ({"manual_runs": "no"}, "manual_runs must be True or False, got 'no'"),
        ({"backfills": 0}, "backfills must be True or False, got 0"),
    ],
)
def test_invalid_fields_are_refused_naming_the_dag_and_the_field(
    contract: dict[str, Any], message: str
) -> None:
    with pytest.raises(DagDefinitionError) as err:
        build(**contract)
    assert "dag 'contracted'" in str(err.value)
    assert message in str(err.value)


def test_outputs_default_to_the_tasks_outlets_and_inputs_include_a_dataset_schedule() -> None:
    plain = build()
    assert plain.structure().outputs() == ("warehouse.a", "warehouse.b")
    assert plain.structure().inputs() == ()

    @dag(dag_id="consumer", schedule=[Dataset("warehouse.a")], inlets=["raw.extra"], outlets=["mart.x"])
    def consumer() -> None:
        publish()

    s = consumer.structure()
    assert s.inputs() == ("raw.extra", "warehouse.a")
    assert s.outputs() == ("mart.x", "warehouse.a", "warehouse.b")


def test_a_freshness_slo_needs_outputs() -> None:
    with pytest.raises(DagDefinitionError, match="freshness_slo applies to the DAG's outputs"):

        @dag(dag_id="no_outputs", freshness_slo="1h")
        def no_outputs() -> None:
            produce()

    @dag(dag_id="declared_output", freshness_slo="1h", outlets=["warehouse.manual"])
    def declared_output() -> None:
        produce()

    assert declared_output.structure().contract.freshness_slo_s == 3600


def test_a_dag_without_a_contract_keeps_its_version_hash() -> None:
    @dag(dag_id="legacy")
    def legacy() -> None:
        produce()

    data = legacy.structure().to_json()
    assert "contract" not in data and "param_rules" not in data
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert legacy.structure().content_hash() == hashlib.sha256(canonical.encode()).hexdigest()
    # Declaring the defaults explicitly is still no contract.
    same = build(manual_runs=True, backfills=True, purpose="", inlets=[], criticality=None)
    assert "contract" not in same.structure().to_json()


def test_json_written_before_contracts_existed_still_reads() -> None:
    old = {
        "dag_id": "old",
        "owner": "treadle",
        "description": "",
        "tags": [],
        "schedule": None,
        "params_schema": None,
        "fileloc": "",
        "max_active_tasks": None,
        "tasks": {"t": {"task_id": "t"}},
    }
    s = DagStructure.from_json(old)
    assert s.contract == DagContract() and s.param_rules == ()
    assert s.contract.manual_runs and s.contract.backfills
    assert s.to_json() == {**old, "tasks": {"t": s.tasks["t"].to_json()}}


def test_calling_the_decorated_function_returns_the_same_dag() -> None:
    d = build()
    assert d() is d
    with pytest.raises(DagDefinitionError, match="takes no arguments: declare run parameters"):
        d(1)


def test_the_airflow_call_at_the_end_of_a_file_defines_the_dag_once(tmp_path: Path) -> None:
    (tmp_path / "idiom.py").write_text(
        "from treadle import dag, task\n"
        "@task\n"
        "def hello():\n"
        "    return 'hi'\n"
        "@dag(dag_id='idiom')\n"
        "def idiom():\n"
        "    hello()\n"
        "the_dag = idiom()\n"
    )
    loaded = load_folder(tmp_path)
    assert loaded.errors == {}
    assert list(loaded.dags) == ["idiom"]
    assert list(loaded.dags["idiom"].tasks) == ["hello"]
