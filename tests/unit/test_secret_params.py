"""Secret params: masked for operators, never changed for tasks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from treadle import Param
from treadle.authoring.params import build_params_schema
from treadle.domain.params import resolve_params
from treadle.domain.records import RunInfo
from treadle.domain.secret_params import MASK, is_secret_path, mask_run, mask_secrets
from treadle.errors import ParamsInvalid

SCHEMA = build_params_schema(
    {
        "password": Param("", type="string", format="password"),
        "token": Param("defaultx", type="string", writeOnly=True, minLength=8),
        "limit": Param(10, type="integer"),
        "db": Param(
            {"host": "h", "secret": ""},
            type="object",
            properties={"host": {"type": "string"}, "secret": {"type": "string", "writeOnly": True}},
        ),
    },
    allow_extra=False,
    where="dag 't'",
)


def test_values_the_schema_marks_secret_are_masked_and_the_rest_kept() -> None:
    params = {"password": "hunter2", "token": "abcdefgh", "limit": 3, "db": {"host": "x", "secret": "s3"}}
    assert mask_secrets(params, SCHEMA) == {
        "password": MASK,
        "token": MASK,
        "limit": 3,
        "db": {"host": "x", "secret": MASK},
    }
    assert params["password"] == "hunter2"  # the input is not changed: the task still needs it


@pytest.mark.parametrize("schema", [None, {"type": "object"}])
def test_nothing_is_secret_without_a_schema_that_says_so(schema: dict[str, object] | None) -> None:
    assert mask_secrets({"password": "x"}, schema) == {"password": "x"}


def test_a_run_is_masked_in_its_conf_params_and_manifest() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    run = RunInfo(
        run_id="r",
        dag_id="t",
        dag_version_id=1,
        run_type="manual",
        logical_date=now,
        state="running",
        conf={"password": "canary"},
        triggered_by="cli:me",
        created_at=now,
        started_at=now,
        ended_at=None,
        params={"password": "canary", "limit": 10},
        manifest={"run_id": "r", "params": {"password": "canary", "limit": 10}},
    )
    shown = mask_run(run, SCHEMA)
    assert "canary" not in repr(shown)
    assert shown.manifest == {"run_id": "r", "params": {"password": MASK, "limit": 10}}
    assert run.params == {"password": "canary", "limit": 10}


def test_secret_paths() -> None:
    assert is_secret_path(SCHEMA, ["token"])
    assert is_secret_path(SCHEMA, ["db", "secret"])
    assert not is_secret_path(SCHEMA, ["db", "host"])
    assert not is_secret_path(SCHEMA, ["limit"])
    assert not is_secret_path(None, ["token"])


def test_an_invalid_secret_is_reported_without_its_value() -> None:
    with pytest.raises(ParamsInvalid) as raised:
        resolve_params("t", SCHEMA, {"token": "canary"})
    assert "canary" not in str(raised.value)
    assert "$.token" in str(raised.value) and "minLength" in str(raised.value)
    # A missing secret is still named as missing.
    schema = build_params_schema(
        {"token": Param(type="string", writeOnly=True)}, allow_extra=False, where="d"
    )
    with pytest.raises(ParamsInvalid, match="missing required param 'token'"):
        resolve_params("t", schema, {})
