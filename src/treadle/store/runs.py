"""Queries on DAG runs."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.records import RunInfo
from treadle.domain.states import ACTIVE_TASK_STATES, TERMINAL_RUN_STATES, RunState
from treadle.domain.transitions import UseCase, run_sources
from treadle.store import dialects
from treadle.store.tables import dag_runs, dags, task_instances


def insert_run(conn: Connection, run: RunInfo) -> None:
    """Insert a new run row (the unique key forbids a second run per dag/date/type)."""
    insert_runs(conn, [run])


def insert_runs(conn: Connection, runs: list[RunInfo]) -> None:
    """Insert new run rows in one statement."""
    if runs:
        # Shallow: asdict() would deep-copy every manifest.
        dialects.insert_many(
            conn, dag_runs, [{f.name: getattr(r, f.name) for f in _RUN_FIELDS} for r in runs]
        )


_RUN_FIELDS = fields(RunInfo)


def _info(row: sa.Row[Any]) -> RunInfo:
    return RunInfo(**row._mapping)


def get_run(conn: Connection, run_id: str) -> RunInfo | None:
    """Return one run, or None."""
    row = conn.execute(sa.select(dag_runs).where(dag_runs.c.run_id == run_id)).first()
    return _info(row) if row else None


def list_runs(conn: Connection, *, dag_id: str | None, limit: int) -> list[RunInfo]:
    """Return the newest runs, optionally of one DAG."""
    stmt = sa.select(dag_runs).order_by(dag_runs.c.created_at.desc()).limit(limit)
    if dag_id:
        stmt = stmt.where(dag_runs.c.dag_id == dag_id)
    return [_info(r) for r in conn.execute(stmt)]


def runs_for_versions(conn: Connection, run_ids: list[str]) -> dict[str, RunInfo]:
    """Return the given runs by id."""
    if not run_ids:
        return {}
    rows = conn.execute(sa.select(dag_runs).where(dag_runs.c.run_id.in_(run_ids)))
    return {r.run_id: _info(r) for r in rows}


def has_active_tasks(conn: Connection, run_id: str) -> bool:
    """True while any task instance of the run is not terminal (an index probe, not a count)."""
    stmt = (
        sa.select(task_instances.c.id)
        .where(
            task_instances.c.run_id == run_id,
            task_instances.c.state.in_([s.value for s in ACTIVE_TASK_STATES]),
        )
        .limit(1)
    )
    return conn.execute(stmt).first() is not None


def has_unsuccessful_tasks(conn: Connection, run_id: str) -> bool:
    """True if any task instance of the run ended other than success or skipped."""
    stmt = (
        sa.select(task_instances.c.id)
        .where(task_instances.c.run_id == run_id, task_instances.c.state.not_in(["success", "skipped"]))
        .limit(1)
    )
    return conn.execute(stmt).first() is not None


def lock_run_state(conn: Connection, run_id: str) -> RunState | None:
    """The state of a run, its row locked until the transaction ends (None: no such run).

    The run open/close protocol (docs/architecture.md): closers decide only while holding this
    lock, and reopeners take it after their task-instance writes, in the same transaction.
    """
    stmt = sa.select(dag_runs.c.state).where(dag_runs.c.run_id == run_id)
    state = conn.execute(dialects.lock_row(stmt, conn)).scalar()
    return None if state is None else RunState(state)


def set_run_state(
    conn: Connection,
    run_id: str,
    *,
    by: UseCase,
    new: RunState,
    now: datetime,
    expected: RunState | None = None,
) -> bool:
    """Compare-and-set a run's state along an edge of the state machine made by `by`.

    The row must be in a state `by` may move to `new` (and in `expected`, when given);
    returns False if it was not.
    """
    sources = run_sources(by, new)
    if expected is not None:
        sources = tuple(s for s in sources if s == expected.value)
    result = conn.execute(
        sa.update(dag_runs)
        .where(dag_runs.c.run_id == run_id, dag_runs.c.state.in_(sources))
        .values(state=new.value, ended_at=now if new in TERMINAL_RUN_STATES else None)
    )
    return bool(result.rowcount)


def idle_running_run_ids(conn: Connection, *, limit: int) -> list[str]:
    """Running runs (oldest first) with no task instance left to finish, found in one statement."""
    active = sa.select(task_instances.c.id).where(
        task_instances.c.run_id == dag_runs.c.run_id,
        task_instances.c.state.in_([s.value for s in ACTIVE_TASK_STATES]),
    )
    stmt = (
        sa.select(dag_runs.c.run_id)
        .where(dag_runs.c.state == RunState.RUNNING.value, ~active.exists())
        .order_by(dag_runs.c.created_at)
        .limit(limit)
    )
    return list(conn.execute(stmt).scalars())


def list_runs_page(
    conn: Connection,
    *,
    dag_id: str | None,
    state: str | None,
    run_type: str | None,
    teams: frozenset[str] | None,
    before: tuple[datetime, str] | None,
    limit: int,
) -> list[RunInfo]:
    """One page of runs, newest first (created_at, then run_id, descending).

    `before` is the (created_at, run_id) of the last run of the previous page: a keyset cursor,
    so a page costs the same however deep it is. `teams` keeps only runs of DAGs those teams
    own (None: every team).
    """
    stmt = sa.select(dag_runs).order_by(dag_runs.c.created_at.desc(), dag_runs.c.run_id.desc()).limit(limit)
    if dag_id is not None:
        stmt = stmt.where(dag_runs.c.dag_id == dag_id)
    if state is not None:
        stmt = stmt.where(dag_runs.c.state == state)
    if run_type is not None:
        stmt = stmt.where(dag_runs.c.run_type == run_type)
    if teams is not None:
        owned = sa.select(dags.c.dag_id).where(dags.c.team.in_(sorted(teams)))
        stmt = stmt.where(dag_runs.c.dag_id.in_(owned))
    if before is not None:
        at, run_id = before
        stmt = stmt.where(
            sa.or_(
                dag_runs.c.created_at < at,
                sa.and_(dag_runs.c.created_at == at, dag_runs.c.run_id < run_id),
            )
        )
    return [_info(r) for r in conn.execute(stmt)]
