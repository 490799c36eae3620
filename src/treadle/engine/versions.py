"""DAG versions by id, cached per database (versions are immutable).

Apart from the DAG registration code in engine/dags.py, so the read commands (`treadle runs
list`) that mask secret params by their version's schema do not import what registration needs:
they read only the params schemas (`params_schemas_of`), without building the structures.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from treadle.store import dags as dag_store
from treadle.store.database import Database

if TYPE_CHECKING:
    from treadle.domain.dag_version import DagVersion

__all__ = ["params_schemas_of", "version_of", "versions_of"]


def version_of(db: Database, conn: Connection, version_id: int) -> DagVersion:
    """Return a DAG version, cached per database (versions are immutable)."""
    found = db.version_cache.get(version_id)
    if found is None:
        versions_of(db, conn, [version_id])
        found = db.version_cache[version_id]
    return found


def versions_of(db: Database, conn: Connection, version_ids: Iterable[int]) -> dict[int, DagVersion]:
    """Return several DAG versions, reading the ones not cached yet in one query."""
    from treadle.domain.dag_version import DagVersion

    wanted = set(version_ids)
    missing = sorted(v for v in wanted if v not in db.version_cache)
    if missing:
        for version_id, (structure, digest) in dag_store.get_structures(conn, missing).items():
            db.version_cache[version_id] = DagVersion.of(version_id, structure, version_hash=digest)
    return {v: db.version_cache[v] for v in wanted}


def params_schemas_of(
    db: Database, conn: Connection, version_ids: Iterable[int]
) -> dict[int, dict[str, Any] | None]:
    """Return the params schemas of several DAG versions: from the versions already built, else
    read in one query (and cached per database) without building the versions."""
    wanted = set(version_ids)
    found: dict[int, dict[str, Any] | None] = {}
    for v in wanted:
        if v in db.version_cache:
            found[v] = db.version_cache[v].structure.params_schema
        elif v in db.params_schema_cache:
            found[v] = db.params_schema_cache[v]
    missing = sorted(wanted - found.keys())
    if missing:
        read = dag_store.get_params_schemas(conn, missing)
        db.params_schema_cache.update(read)
        found.update(read)
    return found
