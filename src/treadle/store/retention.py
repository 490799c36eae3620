"""Retention queries: find and delete finished history older than a cutoff, in bounded batches.

Callers choose the cutoff (from the database clock) and the batch size; nothing here decides
what is old. Runs are only ever selected with positive evidence: a terminal state AND an
`ended_at` before the cutoff (RELIABILITY F8).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TERMINAL_RUN_STATES
from treadle.store import idempotency
from treadle.store.tables import (
    alert_firings,
    audit_log,
    dag_runs,
    job_cancellations,
    task_attempts,
    task_instances,
    task_map_items,
    task_results,
    workers,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrunedRows:
    """Rows deleted (or, in a dry run, that would be deleted), per table."""

    dag_runs: int = 0
    task_instances: int = 0
    task_attempts: int = 0
    task_results: int = 0
    task_map_items: int = 0
    job_cancellations: int = 0
    audit_log: int = 0
    workers: int = 0
    #: Expired Idempotency-Keys (they carry their own expiry; pruned whatever the cutoffs).
    idempotency_keys: int = 0
    #: Alert firings no deduplication needs any more (see `_old_firing_condition`).
    alert_firings: int = 0

    def __add__(self, other: PrunedRows) -> PrunedRows:
        return PrunedRows(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def total(self) -> int:
        """Rows over all tables."""
        return sum(self.by_table().values())

    def by_table(self) -> dict[str, int]:
        """Counts keyed by table name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _old_run_condition(cutoff: datetime) -> sa.ColumnElement[bool]:
    # Meant for ix_dag_runs_ended_at: a short range scan in ended_at order, since active runs
    # have no ended_at. `state || ''` keeps SQLite (no statistics) from picking a state index
    # instead, which matches nearly every run of a long history and then sorts them all.
    return sa.and_(
        dag_runs.c.ended_at < cutoff,
        dag_runs.c.state.concat("").in_(sorted(TERMINAL_RUN_STATES)),
    )


def _old_worker_condition(cutoff: datetime) -> sa.ColumnElement[bool]:
    # No heartbeat since the cutoff: stopped long ago, or died without saying so.
    return workers.c.last_heartbeat_at < cutoff


def _old_firing_condition(cutoff: datetime) -> sa.ColumnElement[bool]:
    # Fired before `cutoff` (the caller makes it no later than the history's cutoff and the
    # longest deduplication window in use) and about a run that is gone, or about no run at all
    # (a freshness miss, a backfill): neither a repeat's window nor an occurrence that can come
    # back under the same key (a run still waiting for inspection, still running) needs it.
    # No index on fired_at: the table holds one row per alert, and a batch stops at `limit`.
    run_gone = ~sa.exists().where(dag_runs.c.run_id == alert_firings.c.run_id)
    return sa.and_(
        alert_firings.c.fired_at < cutoff,
        sa.or_(alert_firings.c.run_id.is_(None), run_gone),
    )


def count_prunable(
    conn: Connection,
    *,
    cutoff: datetime | None,
    audit_cutoff: datetime | None,
    now: datetime | None = None,
    firings_cutoff: datetime | None = None,
) -> PrunedRows:
    """Count every row a full prune would delete, per table (reads only).

    `cutoff` bounds runs and workers (None: none go), `audit_cutoff` audit entries (None: none go),
    `now` the Idempotency-Keys that expired (None: none go), `firings_cutoff` alert firings
    (None: none go; the rows of runs a prune deletes count as gone).
    """

    def count(table: sa.Table, condition: sa.ColumnElement[bool]) -> int:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(condition)).scalar_one())

    audit = count(audit_log, audit_log.c.at < audit_cutoff) if audit_cutoff is not None else 0
    keys = idempotency.count_expired(conn, now=now) if now is not None else 0
    if cutoff is None:
        return PrunedRows(audit_log=audit, idempotency_keys=keys)
    old_runs = sa.select(dag_runs.c.run_id).where(_old_run_condition(cutoff)).scalar_subquery()
    firings = 0
    if firings_cutoff is not None:
        firings = count(
            alert_firings,
            sa.and_(
                alert_firings.c.fired_at < firings_cutoff,
                sa.or_(
                    alert_firings.c.run_id.is_(None),
                    alert_firings.c.run_id.in_(old_runs),
                    ~sa.exists().where(dag_runs.c.run_id == alert_firings.c.run_id),
                ),
            ),
        )
    return PrunedRows(
        dag_runs=count(dag_runs, _old_run_condition(cutoff)),
        task_instances=count(task_instances, task_instances.c.run_id.in_(old_runs)),
        task_attempts=count(task_attempts, task_attempts.c.run_id.in_(old_runs)),
        task_results=count(task_results, task_results.c.run_id.in_(old_runs)),
        task_map_items=count(task_map_items, task_map_items.c.run_id.in_(old_runs)),
        job_cancellations=count(job_cancellations, job_cancellations.c.run_id.in_(old_runs)),
        audit_log=audit,
        workers=count(workers, _old_worker_condition(cutoff)),
        idempotency_keys=keys,
        alert_firings=firings,
    )


def lock_old_runs(conn: Connection, *, cutoff: datetime, limit: int) -> list[str]:
    """Return (and lock until commit) up to `limit` terminal runs that ended before `cutoff`, oldest first.

    On PostgreSQL the rows are locked `FOR UPDATE SKIP LOCKED`, so a run that is being reopened
    (a requeued dead letter) is skipped rather than deleted under it, and two schedulers pruning
    at once take disjoint batches. SQLite renders no lock clause: its write transaction already
    holds the database lock.
    """
    stmt = (
        sa.select(dag_runs.c.run_id)
        .where(_old_run_condition(cutoff))
        .order_by(dag_runs.c.ended_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(conn.execute(stmt).scalars())


def delete_runs(conn: Connection, run_ids: list[str]) -> PrunedRows:
    """Delete the given runs with their task instances, attempts, results, mapped elements and
    external job cancels, owed or done (children first).

    Precondition: `run_ids` come from `lock_old_runs` in the same transaction.
    """
    if not run_ids:
        return PrunedRows()

    def delete(table: sa.Table) -> int:
        return int(conn.execute(sa.delete(table).where(table.c.run_id.in_(run_ids))).rowcount)

    return PrunedRows(
        task_results=delete(task_results),
        task_map_items=delete(task_map_items),
        job_cancellations=delete(job_cancellations),
        task_attempts=delete(task_attempts),
        task_instances=delete(task_instances),
        dag_runs=delete(dag_runs),
    )


def delete_old_audit_entries(conn: Connection, *, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` audit entries recorded before `cutoff`, oldest first; returns how many.

    The audit log is append-only: entries are only ever deleted whole, past their retention,
    never updated (no statement in treadle updates `audit_log`).
    """
    ids = list(
        conn.execute(
            sa.select(audit_log.c.id)
            .where(audit_log.c.at < cutoff)
            .order_by(audit_log.c.at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    if not ids:
        return 0
    return int(conn.execute(sa.delete(audit_log).where(audit_log.c.id.in_(ids))).rowcount)


def delete_old_workers(conn: Connection, *, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` workers whose last heartbeat is before `cutoff`; returns how many."""
    ids = list(
        conn.execute(
            sa.select(workers.c.worker_id)
            .where(_old_worker_condition(cutoff))
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    if not ids:
        return 0
    # Re-checked in the delete: a worker that heartbeated since the select keeps its row.
    stmt = sa.delete(workers).where(workers.c.worker_id.in_(ids), _old_worker_condition(cutoff))
    return int(conn.execute(stmt).rowcount)


def delete_old_alert_firings(conn: Connection, *, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` alert firings older than `cutoff` whose run is gone (or that are
    about no run); returns how many. Run after the batch's runs were deleted."""
    keys = list(
        conn.execute(
            sa.select(alert_firings.c.key)
            .where(_old_firing_condition(cutoff))
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    if not keys:
        return 0
    return int(conn.execute(sa.delete(alert_firings).where(alert_firings.c.key.in_(keys))).rowcount)


def existing_run_ids(conn: Connection, run_ids: list[str]) -> set[str]:
    """Those of `run_ids` that still have a `dag_runs` row (a primary-key lookup each)."""
    if not run_ids:
        return set()
    return set(conn.execute(sa.select(dag_runs.c.run_id).where(dag_runs.c.run_id.in_(run_ids))).scalars())
