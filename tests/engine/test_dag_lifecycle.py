"""A DAG whose file is gone, or no longer defines it, becomes inactive on the next sync: kept
with its history, refused by triggers and the scheduler, and active again when it comes back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from treadle import dag, task
from treadle.domain.dag_version import DagStructure
from treadle.engine import queries
from treadle.engine.dags import SyncReport, sync_dags
from treadle.engine.leadership import Leadership
from treadle.engine.runs import trigger_run
from treadle.engine.schedules import schedule_view
from treadle.engine.scheduling import fire_due_schedules
from treadle.errors import DagInactive
from treadle.store import dags as dag_store
from treadle.store.database import Database, db_now

FOLDER = "/srv/dags"
ALPHA = f"{FOLDER}/alpha.py"
BETA = f"{FOLDER}/beta.py"


@task
def noop() -> int:
    return 1


def _structure(dag_id: str, fileloc: str, **kwargs: Any) -> DagStructure:
    @dag(dag_id=dag_id, **kwargs)
    def built() -> None:
        noop()

    built.fileloc = fileloc
    return built.structure()


def _sync(db: Database, structures: list[DagStructure], files: list[str], **kw: Any) -> SyncReport:
    errors: dict[str, tuple[str, str]] = kw.pop("errors", {})
    return sync_dags(db, structures=structures, scanned_files=files, errors=errors, **kw)


def _active(db: Database) -> dict[str, bool]:
    return {d.dag_id: d.is_active for d in queries.list_dags(db)}


def test_a_deleted_file_makes_its_dag_inactive_with_history_until_it_returns(db: Database) -> None:
    alpha, beta = _structure("alpha", ALPHA), _structure("beta", BETA)
    _sync(db, [alpha, beta], [ALPHA, BETA], folder=FOLDER)
    run = trigger_run(db, "beta", triggered_by="test")

    report = _sync(db, [alpha], [ALPHA], folder=FOLDER)  # beta.py deleted

    assert report.deactivated == (("beta", BETA),)
    assert _active(db) == {"alpha": True, "beta": False}
    assert [r.run_id for r in queries.list_runs(db, dag_id="beta")] == [run.run_id]
    with pytest.raises(DagInactive) as refused:
        trigger_run(db, "beta", triggered_by="test")
    assert (refused.value.dag_id, refused.value.fileloc) == ("beta", BETA)
    assert f"DAG 'beta' is inactive: the last sync of the DAG folder found {BETA} deleted" in str(
        refused.value
    )
    assert _sync(db, [alpha], [ALPHA], folder=FOLDER).deactivated == ()  # reported once

    back = _sync(db, [alpha, beta], [ALPHA, BETA], folder=FOLDER)

    assert back.deactivated == ()
    assert _active(db) == {"alpha": True, "beta": True}
    assert trigger_run(db, "beta", triggered_by="test").dag_id == "beta"
    assert len(queries.list_runs(db, dag_id="beta")) == 2


def test_a_file_that_no_longer_defines_a_dag_deactivates_it_and_a_broken_file_does_not(db: Database) -> None:
    _sync(db, [_structure("alpha", ALPHA), _structure("beta", BETA)], [ALPHA, BETA])

    # A pass over two files without the folder: alpha.py now defines another DAG, beta.py fails.
    report = _sync(db, [_structure("gamma", ALPHA)], [ALPHA, BETA], errors={BETA: ("SyntaxError: x", "tb")})

    assert report.deactivated == (("alpha", ALPHA),)
    assert _active(db) == {"alpha": False, "beta": True, "gamma": True}


def test_a_pass_leaves_alone_dags_outside_what_it_looked_at(db: Database) -> None:
    elsewhere = _structure("elsewhere", "/opt/other/elsewhere.py")
    _sync(db, [elsewhere, _structure("alpha", ALPHA)], ["/opt/other/elsewhere.py", ALPHA])

    assert _sync(db, [], [], folder=FOLDER).deactivated == (("alpha", ALPHA),)
    assert _active(db) == {"alpha": False, "elsewhere": True}


def test_the_scheduler_does_not_fire_an_inactive_dag(db: Database) -> None:
    now = db.query(db_now)
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    hourly = _structure("hourly", ALPHA, schedule=timedelta(hours=1), start_date=start, catchup=False)
    _sync(db, [hourly], [ALPHA], folder=FOLDER)
    _sync(db, [], [], folder=FOLDER)
    leadership = Leadership(db, holder="test-leader", lease_s=60)
    assert leadership.refresh() and leadership.epoch is not None

    def fire() -> list[str]:
        assert leadership.epoch is not None
        report = fire_due_schedules(
            db, holder="test-leader", epoch=leadership.epoch, default_queue_timeout_s=60
        )
        return [r.dag_id for r in report.created]

    assert fire() == []
    assert schedule_view(db, "hourly").is_active is False
    _sync(db, [hourly], [ALPHA], folder=FOLDER)
    assert schedule_view(db, "hourly").is_active is True
    assert fire() == ["hourly"]


def test_a_sync_larger_than_a_batch_registers_every_dag_once(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    count = dag_store.BATCH * 2 + 7
    structures = [_structure(f"d{n:04d}", f"{FOLDER}/d{n:04d}.py") for n in range(count)]
    files = [s.fileloc for s in structures]
    first = _sync(db, structures, files, folder=FOLDER)
    stamps = {d.dag_id: d.updated_at for d in queries.list_dags(db)}

    again = _sync(db, structures, files, folder=FOLDER)
    changed = _structure("d0003", f"{FOLDER}/d0003.py", tags=["new"])
    third = _sync(db, [*structures[:3], changed, *structures[4:]], files, folder=FOLDER)

    assert len(first.versions) == count and len(set(first.versions.values())) == count
    assert again.versions == first.versions
    assert {d.dag_id: d.updated_at for d in queries.list_dags(db)}.items() - stamps.items() == {
        ("d0003", queries.list_dags(db)[3].updated_at)
    }
    assert third.versions["d0003"] != first.versions["d0003"]
    assert {k: v for k, v in third.versions.items() if k != "d0003"} == {
        k: v for k, v in first.versions.items() if k != "d0003"
    }
    assert queries.list_dags(db)[3].tags == ("new",)
    db.dispose()
