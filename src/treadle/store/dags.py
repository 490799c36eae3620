"""Queries on DAGs, their serialized versions, and per-file load errors."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure
from treadle.domain.records import DagInfo, LoadErrorInfo
from treadle.store.tables import dag_load_errors, dag_versions, dags


def upsert_dag_version(conn: Connection, structure: DagStructure, *, now: datetime) -> int:
    """Register a DAG's structure; a new content hash becomes a new version. Returns its id."""
    digest = structure.content_hash()
    version_id = conn.execute(
        sa.select(dag_versions.c.id).where(
            dag_versions.c.dag_id == structure.dag_id, dag_versions.c.version_hash == digest
        )
    ).scalar()
    if version_id is None:
        version_id = conn.execute(
            sa.insert(dag_versions)
            .values(
                dag_id=structure.dag_id,
                version_hash=digest,
                structure=structure.to_json(),
                created_at=now,
            )
            .returning(dag_versions.c.id)
        ).scalar_one()
    values = {
        "owner": structure.owner,
        "description": structure.description,
        "tags": list(structure.tags),
        "fileloc": structure.fileloc,
        "latest_version_id": version_id,
        "max_active_tasks": structure.max_active_tasks,
        "team": structure.team,
        "is_active": True,
        "updated_at": now,
    }
    updated = conn.execute(sa.update(dags).where(dags.c.dag_id == structure.dag_id).values(**values)).rowcount
    if not updated:
        conn.execute(sa.insert(dags).values(dag_id=structure.dag_id, **values))
    return int(version_id)


def replace_load_errors(
    conn: Connection,
    *,
    scanned: Iterable[str],
    errors: dict[str, tuple[str, str]],
    now: datetime,
    folder: str | None = None,
) -> None:
    """Record the load errors of one folder pass: files that now load cleanly lose their error,
    and so do files under `folder` that are gone (deleted or renamed)."""
    scanned = set(scanned) | set(errors)
    if folder is not None:
        prefix = folder.rstrip("/") + "/"
        recorded = conn.execute(sa.select(dag_load_errors.c.fileloc)).scalars()
        scanned |= {f for f in recorded if f.startswith(prefix)}
    if scanned:
        conn.execute(sa.delete(dag_load_errors).where(dag_load_errors.c.fileloc.in_(scanned)))
    if errors:
        conn.execute(
            sa.insert(dag_load_errors),
            [
                {"fileloc": f, "message": m, "traceback": t, "recorded_at": now}
                for f, (m, t) in errors.items()
            ],
        )


def list_load_errors(conn: Connection) -> list[LoadErrorInfo]:
    """Return every recorded load error, by file."""
    rows = conn.execute(sa.select(dag_load_errors).order_by(dag_load_errors.c.fileloc))
    return [LoadErrorInfo(**r._mapping) for r in rows]


def load_error(conn: Connection, fileloc: str) -> LoadErrorInfo | None:
    """The load error recorded for one DAG file, if it has one now."""
    row = conn.execute(sa.select(dag_load_errors).where(dag_load_errors.c.fileloc == fileloc)).first()
    return LoadErrorInfo(**row._mapping) if row else None


def _dag_select() -> sa.Select[tuple[object, ...]]:
    return sa.select(dags, dag_versions.c.version_hash).select_from(
        dags.outerjoin(dag_versions, dag_versions.c.id == dags.c.latest_version_id)
    )


def _dag_info(row: sa.Row[tuple[object, ...]]) -> DagInfo:
    m = row._mapping
    return DagInfo(
        dag_id=m["dag_id"],
        owner=m["owner"],
        description=m["description"],
        tags=tuple(m["tags"] or ()),
        fileloc=m["fileloc"],
        is_paused=bool(m["is_paused"]),
        latest_version_id=m["latest_version_id"],
        version_hash=m["version_hash"],
        updated_at=m["updated_at"],
        max_active_tasks=m["max_active_tasks"],
        team=m["team"],
    )


def list_dags(conn: Connection) -> list[DagInfo]:
    """Return every registered DAG, by id."""
    return [_dag_info(r) for r in conn.execute(_dag_select().order_by(dags.c.dag_id))]


def get_dag(conn: Connection, dag_id: str) -> DagInfo | None:
    """Return one DAG, or None."""
    row = conn.execute(_dag_select().where(dags.c.dag_id == dag_id)).first()
    return _dag_info(row) if row else None


def get_structure(conn: Connection, version_id: int) -> DagStructure:
    """Return the serialized structure of a DAG version (versions never change)."""
    data = conn.execute(
        sa.select(dag_versions.c.structure).where(dag_versions.c.id == version_id)
    ).scalar_one()
    return DagStructure.from_json(data)


def set_paused(conn: Connection, dag_id: str, *, paused: bool, now: datetime) -> bool | None:
    """Set a DAG's pause flag; returns whether it changed, or None if there is no such DAG."""
    current = conn.execute(sa.select(dags.c.is_paused).where(dags.c.dag_id == dag_id)).first()
    if current is None:
        return None
    if bool(current.is_paused) == paused:
        return False
    conn.execute(sa.update(dags).where(dags.c.dag_id == dag_id).values(is_paused=paused, updated_at=now))
    return True


def get_structures(conn: Connection, version_ids: list[int]) -> dict[int, tuple[DagStructure, str]]:
    """Return the structures of several DAG versions with their stored hashes, by version id."""
    rows = conn.execute(
        sa.select(dag_versions.c.id, dag_versions.c.structure, dag_versions.c.version_hash).where(
            dag_versions.c.id.in_(version_ids)
        )
    )
    return {r.id: (DagStructure.from_json(r.structure), r.version_hash) for r in rows}
