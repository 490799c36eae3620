"""Dataset ownership use cases: set a dataset's owning team, grant and revoke other teams.

Each change is one transaction with its audit entry. Enforcement happens when DAGs are synced
(engine/dags.py refuses a DAG emitting to a dataset its team may not).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from treadle.domain.identifiers import is_dataset_name, is_identifier
from treadle.engine.accounts import Caller
from treadle.errors import AccountNotFound, InvalidRequest
from treadle.store import audit, dataset_teams
from treadle.store import users as user_store
from treadle.store.database import Database, db_now
from treadle.store.dataset_teams import DatasetAccessRow

__all__ = ["DatasetAccessRow", "grant_dataset", "list_dataset_access", "revoke_dataset", "set_dataset_owner"]


def _check(conn: Connection, dataset: str, team: str) -> None:
    if not is_dataset_name(dataset):
        raise InvalidRequest(f"{dataset!r} is not a dataset name")
    if not is_identifier(team):
        raise InvalidRequest(f"team {team!r} must match [A-Za-z0-9._-]")
    if team != "default" and not user_store.team_exists(conn, team):
        raise AccountNotFound(f"no team {team!r} (create it with `treadle teams create {team}`)")


def set_dataset_owner(db: Database, dataset: str, *, team: str, by: Caller) -> str | None:
    """Make `team` the owner of `dataset`; returns the previous owner (None: it had none).

    DAGs already registered keep their versions; the next sync refuses those no longer allowed.
    """

    def work(conn: Connection) -> str | None:
        _check(conn, dataset, team)
        now = db_now(conn)
        previous = dataset_teams.set_owner(conn, dataset, team=team, now=now, by=by.actor)
        audit.record(
            conn,
            at=now,
            actor=by.actor,
            action="dataset.set_owner",
            target=f"dataset:{dataset}",
            details={"team": team, "previous": previous},
            address=by.address,
        )
        return previous

    return db.transact(work)


def grant_dataset(db: Database, dataset: str, *, team: str, by: Caller) -> bool:
    """Let DAGs of `team` emit to `dataset`; False if they already could by a grant.

    Raises InvalidRequest when the dataset has no owner yet (set one first) or `team` owns it.
    """

    def work(conn: Connection) -> bool:
        _check(conn, dataset, team)
        owner = dataset_teams.owners_of(conn, [dataset], lock=True).get(dataset)
        if owner is None:
            raise InvalidRequest(
                f"dataset {dataset!r} has no owner yet: "
                f"set one first (`treadle datasets owner {dataset} TEAM`)"
            )
        if owner == team:
            raise InvalidRequest(f"team {team!r} owns dataset {dataset!r} already")
        now = db_now(conn)
        changed = dataset_teams.grant(conn, dataset, team=team, now=now, by=by.actor)
        if changed:
            audit.record(
                conn,
                at=now,
                actor=by.actor,
                action="dataset.grant",
                target=f"dataset:{dataset}",
                details={"team": team},
                address=by.address,
            )
        return changed

    return db.transact(work)


def revoke_dataset(db: Database, dataset: str, *, team: str, by: Caller) -> bool:
    """Take back a team's grant on a dataset; False if it had none.

    DAGs already registered keep their versions; the next sync refuses those no longer allowed.
    """

    def work(conn: Connection) -> bool:
        _check(conn, dataset, team)
        now = db_now(conn)
        changed = dataset_teams.revoke(conn, dataset, team=team)
        if changed:
            audit.record(
                conn,
                at=now,
                actor=by.actor,
                action="dataset.revoke",
                target=f"dataset:{dataset}",
                details={"team": team},
                address=by.address,
            )
        return changed

    return db.transact(work)


def list_dataset_access(db: Database) -> list[DatasetAccessRow]:
    """Every dataset with an owner or grants."""
    return db.query(dataset_teams.list_access)
