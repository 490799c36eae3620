"""Registering DAG structures and load errors found by a pass over the DAG folder."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure, DagVersion
from treadle.engine.schedules import register_schedules
from treadle.store import dags as dag_store
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
    `folder`, that no structure defines any more (dag_store.deactivate_missing)."""

    def work(conn: Connection) -> tuple[dict[str, int], list[tuple[str, str]]]:
        now = db_now(conn)
        versions = dag_store.register_versions(conn, structures, now=now)
        register_schedules(conn, structures, now=now)
        dag_store.replace_load_errors(conn, scanned=scanned_files, errors=errors, now=now, folder=folder)
        gone = dag_store.deactivate_missing(
            conn, present=versions, scanned=scanned_files, failed=errors, folder=folder, now=now
        )
        return versions, gone

    versions, gone = db.transact(work, retry_conflicts=True)
    for dag_id, fileloc in gone:
        log.info(
            "DAG marked inactive: its file is gone or no longer defines it",
            extra={"event": "dag.deactivated", "dag_id": dag_id, "file": fileloc},
        )
    return SyncReport(dags=len(structures), errors=len(errors), versions=versions, deactivated=tuple(gone))


def version_of(db: Database, conn: Connection, version_id: int) -> DagVersion:
    """Return a DAG version, cached per database (versions are immutable)."""
    found = db.version_cache.get(version_id)
    if found is None:
        versions_of(db, conn, [version_id])
        found = db.version_cache[version_id]
    return found


def versions_of(db: Database, conn: Connection, version_ids: Iterable[int]) -> dict[int, DagVersion]:
    """Return several DAG versions, reading the ones not cached yet in one query."""
    wanted = set(version_ids)
    missing = sorted(v for v in wanted if v not in db.version_cache)
    if missing:
        for version_id, (structure, digest) in dag_store.get_structures(conn, missing).items():
            db.version_cache[version_id] = DagVersion.of(version_id, structure, version_hash=digest)
    return {v: db.version_cache[v] for v in wanted}
