"""Retention: prune finished runs, their history, old audit entries, gone workers and the
alert firings deduplication no longer needs.

An alert firing goes once it is older than the history's cutoff and than the longest
deduplication window in use (the deployment's default, the deployment's rules', every active
DAG's rules'), and its run is gone (or it is about no run: a freshness miss, a backfill). Until
then it may still decide a repeat's disposition (`last_sent_at`) or keep an occurrence that
lasts (a run awaiting inspection or over its budget) from alerting again under the same key.

Each batch is its own short transaction, so pruning years of history never holds locks for
long and can stop (or fail) between batches without leaving a run half deleted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from treadle.domain.alerts import AlertRule
from treadle.errors import InvalidRequest
from treadle.store import datasets as dataset_store
from treadle.store import idempotency as key_store
from treadle.store import retention as retention_store
from treadle.store.database import Database, db_now
from treadle.store.retention import PrunedRows

#: Runs deleted per transaction (with all their task instances, attempts and results).
DEFAULT_BATCH_RUNS = 500
#: Audit entries and worker rows are small and have no children: a larger batch is still short.
ROWS_PER_RUN = 10

#: Run ids asked about per query when looking for the files of pruned runs.
RUN_ID_BATCH = 500

__all__ = ["DEFAULT_BATCH_RUNS", "PruneReport", "PrunedRows", "prune", "pruned_runs"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneReport:
    """What one prune deleted (or, in a dry run, would delete)."""

    #: Database time before which finished history was pruned (None: runs and workers kept).
    cutoff: datetime | None
    #: Database time before which audit entries were pruned (None: the audit log was kept).
    audit_cutoff: datetime | None = None
    #: Database time before which alert firings of gone runs were pruned (None: kept).
    firings_cutoff: datetime | None = None
    dry_run: bool
    #: Transactions that deleted something (0 in a dry run).
    batches: int
    #: Rows per table.
    rows: PrunedRows

    @property
    def deleted_anything(self) -> bool:
        """True if a real prune removed at least one row."""
        return not self.dry_run and self.rows.total > 0


def prune(
    db: Database,
    *,
    older_than: timedelta | None,
    audit_older_than: timedelta | None = None,
    dry_run: bool = False,
    batch_runs: int = DEFAULT_BATCH_RUNS,
    max_batches: int | None = None,
    on_deleted: Callable[[list[str]], object] | None = None,
) -> PruneReport:
    """Delete finished runs (with their children) and workers older than `older_than`, audit
    entries older than `audit_older_than`, and expired Idempotency-Keys.

    The cutoffs are the database clock minus each age, read once, so every batch prunes against
    the same instant. Only runs in a terminal state whose `ended_at` is before the cutoff are
    deleted; active runs are never touched, whatever their age. The audit log has its own,
    longer retention: it is kept whole unless `audit_older_than` is given, which may not be
    shorter than `older_than` (an entry outlives the history it describes); entries are deleted
    whole, never edited.

    Args:
        db: The database.
        older_than: Age beyond which finished history goes; must be positive (None: kept).
        audit_older_than: Age beyond which audit entries go; positive (None: all kept).
        dry_run: Count what would be deleted, per table, and delete nothing.
        batch_runs: Most runs deleted per transaction.
        max_batches: Stop after this many batches (the scheduler takes one per pass); None
            loops until nothing old is left.
        on_deleted: Called with the ids of the runs each batch deleted, once it committed (the
            caller deletes their files: manifests, outputs, artifacts).

    Raises:
        InvalidRequest: an age or a batch bound is not positive, both ages are None, or the audit
            age is shorter than the history's.
    """
    check_ages(older_than, audit_older_than)
    if batch_runs < 1 or (max_batches is not None and max_batches < 1):
        raise InvalidRequest("retention batch sizes must be at least 1")
    now = db.query(db_now)
    cutoff = now - older_than if older_than is not None else None
    audit_cutoff = now - audit_older_than if audit_older_than is not None else None
    firings_cutoff = None
    if cutoff is not None:
        window = timedelta(seconds=db.query(lambda conn: longest_dedup_s(db, conn)))
        firings_cutoff = min(cutoff, now - window)
    if dry_run:
        rows = db.query(
            lambda conn: retention_store.count_prunable(
                conn, cutoff=cutoff, audit_cutoff=audit_cutoff, now=now, firings_cutoff=firings_cutoff
            )
        )
        return PruneReport(
            cutoff=cutoff,
            audit_cutoff=audit_cutoff,
            firings_cutoff=firings_cutoff,
            dry_run=True,
            batches=0,
            rows=rows,
        )
    total, batches = PrunedRows(), 0
    while max_batches is None or batches < max_batches:
        deleted, run_ids = db.transact(
            lambda conn: _prune_batch(
                conn,
                cutoff=cutoff,
                audit_cutoff=audit_cutoff,
                firings_cutoff=firings_cutoff,
                now=now,
                batch_runs=batch_runs,
            )
        )
        if on_deleted is not None and run_ids:
            on_deleted(run_ids)
        if deleted.total == 0:
            break
        total, batches = total + deleted, batches + 1
    return PruneReport(
        cutoff=cutoff,
        audit_cutoff=audit_cutoff,
        firings_cutoff=firings_cutoff,
        dry_run=False,
        batches=batches,
        rows=total,
    )


def longest_dedup_s(db: Database, conn: Connection) -> float:
    """The longest deduplication window of the alert rules in use: the deployment's default and
    rules, and the rules of every active DAG's latest version (a rule no DAG declares any more
    has another rule id, so its firings decide no repeat)."""
    rules: list[AlertRule] = list(db.alerting.rules)
    for structure in dataset_store.latest_structures(conn):
        rules.extend(structure.contract.alerts)
    windows = [db.alerting.dedup_s, *(r.dedup_s for r in rules if r.dedup_s is not None)]
    return max(windows)


def check_ages(older_than: timedelta | None, audit_older_than: timedelta | None) -> None:
    """Raise InvalidRequest unless the retention ages are positive and the audit's is the longer."""
    if older_than is None and audit_older_than is None:
        raise InvalidRequest("give a retention age for the history, the audit log, or both")
    for age in (older_than, audit_older_than):
        if age is not None and age <= timedelta(0):
            raise InvalidRequest(f"retention age must be positive, got {age}")
    if older_than is not None and audit_older_than is not None and audit_older_than < older_than:
        raise InvalidRequest(
            f"the audit log's retention ({audit_older_than}) may not be shorter than the history's "
            f"({older_than}): an audit entry outlives what it describes"
        )


def _prune_batch(
    conn: Connection,
    *,
    cutoff: datetime | None,
    audit_cutoff: datetime | None,
    firings_cutoff: datetime | None,
    now: datetime,
    batch_runs: int,
) -> tuple[PrunedRows, list[str]]:
    limit = batch_runs * ROWS_PER_RUN
    audit = (
        retention_store.delete_old_audit_entries(conn, cutoff=audit_cutoff, limit=limit)
        if audit_cutoff is not None
        else 0
    )
    keys = key_store.delete_expired(conn, now=now, limit=limit)
    if cutoff is None:
        return PrunedRows(audit_log=audit, idempotency_keys=keys), []
    run_ids = retention_store.lock_old_runs(conn, cutoff=cutoff, limit=batch_runs)
    runs = retention_store.delete_runs(conn, run_ids)
    firings = (
        retention_store.delete_old_alert_firings(conn, cutoff=firings_cutoff, limit=limit)
        if firings_cutoff is not None
        else 0
    )
    others = PrunedRows(
        audit_log=audit,
        workers=retention_store.delete_old_workers(conn, cutoff=cutoff, limit=limit),
        idempotency_keys=keys,
        alert_firings=firings,
    )
    return runs + others, list(run_ids)


def pruned_runs(db: Database, run_ids: list[str]) -> set[str]:
    """Those of `run_ids` that have no `dag_runs` row any more (pruned, or never existed): the
    hosts that keep files of them (manifests, outputs, logs) may delete those."""
    gone: set[str] = set()
    for start in range(0, len(run_ids), RUN_ID_BATCH):
        batch = run_ids[start : start + RUN_ID_BATCH]
        existing = db.query(functools.partial(retention_store.existing_run_ids, run_ids=batch))
        gone.update(set(batch) - existing)
    return gone
