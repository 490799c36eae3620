"""Registering DAG structures and load errors found by a pass over the DAG folder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure
from treadle.domain.dataset_access import decide_outlets, describe_refusal
from treadle.engine.schedules import register_schedules
from treadle.store import dags as dag_store
from treadle.store import dataset_teams, dialects
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.engine")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncReport:
    """What one sync registered."""

    dags: int
    errors: int
    versions: dict[str, int]
    #: (DAG id, file) of the DAGs this sync marked inactive: their file is gone or no longer
    #: defines them.
    deactivated: tuple[tuple[str, str], ...] = ()


def sync_dags(
    db: Database,
    *,
    structures: list[DagStructure],
    scanned_files: list[str],
    errors: dict[str, tuple[str, str]],
    folder: str | None = None,
) -> SyncReport:
    """Register every structure (new content hash -> new version; its DAG active), replace the
    load errors (of `scanned_files`, and of every file under `folder` when given: the folder's
    full pass) and mark inactive the DAGs whose file the pass imported, or which lie under
    `folder`, that no structure defines any more (dag_store.deactivate_missing).

    A DAG that emits outlets to a dataset its team neither owns nor is granted is not registered
    (a version already registered stays, and so does the DAG's active mark): its file gets a load
    error naming the dataset, its owner and the team. Datasets nobody owns yet become the
    emitting DAG's team's (domain/dataset_access.py).
    """

    def work(conn: Connection) -> tuple[dict[str, int], list[tuple[str, str]], int]:
        dialects.plan_each_statement(conn)  # batches of 500 keys, read and written many times
        now = db_now(conn)
        found = dict(errors)  # built afresh on every attempt: a retried transaction adds nothing twice
        accepted = _check_outlets(conn, structures, found, now=now)
        versions = dag_store.register_versions(conn, accepted, now=now)
        register_schedules(conn, accepted, now=now)
        scanned = sorted({*scanned_files, *(where for where in found if where not in errors)})
        dag_store.replace_load_errors(conn, scanned=scanned, errors=found, now=now, folder=folder)
        gone = dag_store.deactivate_missing(
            conn, present=versions, scanned=scanned_files, failed=found, folder=folder, now=now
        )
        return versions, gone, len(found)

    versions, gone, error_count = db.transact(work, retry_conflicts=True)
    for dag_id, fileloc in gone:
        log.info(
            "DAG marked inactive: its file is gone or no longer defines it",
            extra={"event": "dag.deactivated", "dag_id": dag_id, "file": fileloc},
        )
    return SyncReport(dags=len(versions), errors=error_count, versions=versions, deactivated=tuple(gone))


def _check_outlets(
    conn: Connection, structures: list[DagStructure], errors: dict[str, tuple[str, str]], *, now: datetime
) -> list[DagStructure]:
    """The structures whose outlets their team may emit to; a load error for each other one."""
    outlets = {name for s in structures for name in s.outputs()}
    if not outlets:
        return structures
    owners = dataset_teams.owners_of(conn, outlets)
    grants = dataset_teams.grants_of(conn, outlets)
    decision = decide_outlets(structures, owners=owners, grants=grants)
    claimed = dataset_teams.claim_owners(conn, decision.claims, now=now, by="dag-sync")
    if any(claimed.get(d) != team for d, team in decision.claims.items()):
        # A concurrent sync claimed one of these datasets first: decide again with its owner.
        decision = decide_outlets(structures, owners={**owners, **claimed}, grants=grants)
    for structure in structures:
        refusals = decision.refused.get(structure.dag_id)
        if refusals:
            where = structure.fileloc or f"<dag {structure.dag_id}>"
            message = describe_refusal(structure, refusals)
            earlier = errors.get(where)
            errors[where] = (
                f"{earlier[0]}\n{message}" if earlier else message,
                earlier[1] if earlier else "",
            )
    return [s for s in structures if s.dag_id not in decision.refused]
