"""Dataset ownership per team: a DAG may only emit to datasets its team owns or is granted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from treadle import Dataset, dag, task
from treadle.engine import accounts, queries
from treadle.engine.accounts import Caller
from treadle.engine.dags import sync_dags
from treadle.engine.dataset_access import (
    grant_dataset,
    list_dataset_access,
    revoke_dataset,
    set_dataset_owner,
)
from treadle.errors import AccountNotFound, InvalidRequest
from treadle.store.database import Database

ORDERS = Dataset("lake.orders")
BY = Caller(actor="cli:admin")


@task(outlets=[ORDERS])
def write_orders() -> int:
    return 1


@dag(dag_id="a_ops_orders")
def ops_orders() -> None:
    write_orders()


@dag(dag_id="b_fin_orders", team="finance")
def fin_orders() -> None:
    write_orders()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    url: str = request.getfixturevalue({"sqlite": "sqlite_url", "postgresql": "pg_url"}[request.param])
    database = Database(url)
    accounts.create_team(database, "finance", by=BY)
    yield database
    database.dispose()


def _sync(db: Database, *dags: Any, fileloc: str = "/dags/orders.py") -> None:
    structures = [d.structure() for d in dags]
    structures = [
        type(s)(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "fileloc": fileloc})
        for s in structures
    ]
    sync_dags(db, structures=structures, scanned_files=[fileloc], errors={})


def _registered(db: Database) -> set[str]:
    return {d.dag_id for d in queries.list_dags(db)}


def _errors(db: Database) -> list[str]:
    return [e.message for e in queries.list_load_errors(db)]


def test_the_first_team_to_emit_owns_the_dataset_and_others_are_refused_naming_it(db: Database) -> None:
    _sync(db, fin_orders, ops_orders)  # one sync: DAGs in id order, so a_ops_orders claims it
    assert _registered(db) == {"a_ops_orders"}
    [message] = _errors(db)
    assert "DAG 'b_fin_orders' of team 'finance'" in message
    assert "dataset 'lake.orders' belongs to team 'default'" in message
    assert "treadle datasets grant lake.orders finance" in message
    [access] = list_dataset_access(db)
    assert (access.dataset, access.owner, access.granted) == ("lake.orders", "default", ())


def test_a_grant_lets_the_team_emit_and_a_revoke_refuses_it_again(db: Database) -> None:
    _sync(db, ops_orders, fileloc="/dags/ops.py")
    _sync(db, fin_orders, fileloc="/dags/fin.py")
    assert _registered(db) == {"a_ops_orders"}
    assert grant_dataset(db, "lake.orders", team="finance", by=BY) is True
    assert grant_dataset(db, "lake.orders", team="finance", by=BY) is False
    _sync(db, fin_orders, fileloc="/dags/fin.py")
    assert _registered(db) == {"a_ops_orders", "b_fin_orders"} and _errors(db) == []
    assert revoke_dataset(db, "lake.orders", team="finance", by=BY) is True
    _sync(db, fin_orders, fileloc="/dags/fin.py")
    assert len(_errors(db)) == 1  # refused again (its registered version stays)
    actions = [e.action for e in accounts.list_audit(db, limit=20) if e.target == "dataset:lake.orders"]
    assert actions == ["dataset.revoke", "dataset.grant"]


def test_an_owner_is_set_or_moved_and_bad_requests_are_refused(db: Database) -> None:
    assert set_dataset_owner(db, "lake.orders", team="finance", by=BY) is None
    _sync(db, ops_orders)
    assert _registered(db) == set() and "belongs to team 'finance'" in _errors(db)[0]
    assert set_dataset_owner(db, "lake.orders", team="default", by=BY) == "finance"
    _sync(db, ops_orders)
    assert _registered(db) == {"a_ops_orders"} and _errors(db) == []
    with pytest.raises(AccountNotFound, match="no team 'nope'"):
        set_dataset_owner(db, "lake.orders", team="nope", by=BY)
    with pytest.raises(InvalidRequest, match="owns dataset"):
        grant_dataset(db, "lake.orders", team="default", by=BY)
    with pytest.raises(InvalidRequest, match="no owner yet"):
        grant_dataset(db, "lake.other", team="finance", by=BY)
    with pytest.raises(InvalidRequest, match="not a dataset name"):
        set_dataset_owner(db, "bad name!", team="finance", by=BY)
    [entry] = [
        e for e in accounts.list_audit(db, action="dataset.set_owner", limit=5) if e.details["previous"]
    ]
    assert entry.details == {"team": "default", "previous": "finance"}


@pytest.mark.postgres
def test_a_sync_losing_a_concurrent_claim_decides_with_the_winners_owner(pg_url: str) -> None:
    """Another transaction inserts the owner row after this sync read the owners: the sync's
    claim waits for it, skips, and refuses the DAG as if it had seen that owner."""
    import threading
    import time

    import sqlalchemy as sa

    from treadle.store.database import db_now
    from treadle.store.tables import dataset_owners

    db = Database(pg_url)
    accounts.create_team(db, "finance", by=BY)
    other = db.engine.connect()
    rival = other.begin()
    rival_now = db_now(other)
    other.execute(
        sa.insert(dataset_owners).values(
            dataset="lake.orders", team="finance", created_at=rival_now, created_by="rival"
        )
    )
    synced = threading.Thread(target=_sync, args=(db, ops_orders))
    synced.start()
    deadline = time.monotonic() + 60
    while not db.query(_waits_on_a_lock) and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the database for the sync's lock wait, not waiting a fixed time
    rival.commit()
    synced.join(timeout=60)
    other.close()
    assert _registered(db) == set()
    assert "belongs to team 'finance'" in _errors(db)[0]
    [access] = list_dataset_access(db)
    assert access.owner == "finance"
    db.dispose()


def _waits_on_a_lock(conn: Any) -> bool:
    import sqlalchemy as sa

    found = conn.execute(
        sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
    ).scalar_one()
    return bool(found)
