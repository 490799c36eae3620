"""Dataset ownership: the owning team of each dataset and the teams granted to emit to it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store import dialects
from treadle.store.tables import dataset_grants, dataset_owners


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetAccessRow:
    """A dataset's owner and grants."""

    dataset: str
    owner: str | None
    granted: tuple[str, ...]


def owners_of(conn: Connection, names: Iterable[str], *, lock: bool = False) -> dict[str, str]:
    """dataset -> owning team, for those of `names` that have an owner (`lock`: until commit)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    stmt = sa.select(dataset_owners.c.dataset, dataset_owners.c.team).where(
        dataset_owners.c.dataset.in_(wanted)
    )
    if lock:
        stmt = dialects.lock_row(stmt, conn)
    return {str(d): str(t) for d, t in conn.execute(stmt)}


def grants_of(conn: Connection, names: Iterable[str]) -> dict[str, frozenset[str]]:
    """dataset -> teams granted, for those of `names` with a grant."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    found: dict[str, set[str]] = {}
    stmt = sa.select(dataset_grants.c.dataset, dataset_grants.c.team).where(
        dataset_grants.c.dataset.in_(wanted)
    )
    for dataset, team in conn.execute(stmt):
        found.setdefault(str(dataset), set()).add(str(team))
    return {d: frozenset(t) for d, t in found.items()}


def claim_owners(conn: Connection, claims: Mapping[str, str], *, now: datetime, by: str) -> dict[str, str]:
    """Make each team the owner of its claimed datasets that still have none; returns the owner
    of every claimed dataset afterwards (another team's where a concurrent claim came first).

    The insert skips a dataset whose row exists; one another transaction is inserting makes it
    wait for that one's commit (PostgreSQL, MySQL), so the owners read back are the winners.
    """
    if not claims:
        return {}
    conn.execute(
        dialects.insert_ignore(conn, dataset_owners),
        [{"dataset": d, "team": t, "created_at": now, "created_by": by} for d, t in sorted(claims.items())],
    )
    return owners_of(conn, claims)


def set_owner(conn: Connection, dataset: str, *, team: str, now: datetime, by: str) -> str | None:
    """Make `team` the dataset's owner; returns the previous owner (None: it had none)."""
    previous = owners_of(conn, [dataset], lock=True).get(dataset)
    if previous is None:
        conn.execute(
            sa.insert(dataset_owners).values(dataset=dataset, team=team, created_at=now, created_by=by)
        )
    else:
        conn.execute(
            sa.update(dataset_owners)
            .where(dataset_owners.c.dataset == dataset)
            .values(team=team, created_at=now, created_by=by)
        )
    return previous


def grant(conn: Connection, dataset: str, *, team: str, now: datetime, by: str) -> bool:
    """Grant `team` the right to emit to `dataset`; False if it already had it.

    Precondition: the caller holds the dataset's owner row lock (`owners_of(..., lock=True)`), so
    two grants of one dataset do not race between the read and the insert.
    """
    if team in grants_of(conn, [dataset]).get(dataset, frozenset()):
        return False
    conn.execute(sa.insert(dataset_grants).values(dataset=dataset, team=team, created_at=now, created_by=by))
    return True


def revoke(conn: Connection, dataset: str, *, team: str) -> bool:
    """Take back a grant; False if there was none."""
    result = conn.execute(
        sa.delete(dataset_grants).where(dataset_grants.c.dataset == dataset, dataset_grants.c.team == team)
    )
    return bool(result.rowcount)


def list_access(conn: Connection) -> list[DatasetAccessRow]:
    """Every dataset with an owner or a grant, by name."""
    owners = {
        str(d): str(t) for d, t in conn.execute(sa.select(dataset_owners.c.dataset, dataset_owners.c.team))
    }
    granted: dict[str, list[str]] = {}
    for d, t in conn.execute(
        sa.select(dataset_grants.c.dataset, dataset_grants.c.team).order_by(dataset_grants.c.team)
    ):
        granted.setdefault(str(d), []).append(str(t))
    return [
        DatasetAccessRow(dataset=name, owner=owners.get(name), granted=tuple(granted.get(name, ())))
        for name in sorted(set(owners) | set(granted))
    ]
