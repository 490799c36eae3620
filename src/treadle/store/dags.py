"""Queries on DAGs, their serialized versions, and per-file load errors."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.records import DagInfo, LoadErrorInfo
from treadle.domain.secret_params import params_schema_in
from treadle.store.tables import dag_load_errors, dag_versions, dags

if TYPE_CHECKING:
    from treadle.domain.dag_version import DagStructure

T = TypeVar("T")


#: Rows per statement of a batched sync: well under every dialect's bound-parameter limit.
BATCH = 500


def _chunks(items: Sequence[T], size: int = BATCH) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def register_versions(
    conn: Connection, structures: Sequence[DagStructure], *, now: datetime
) -> dict[str, int]:
    """Register DAGs' structures (a new content hash becomes a new version; the DAG is active);
    returns each DAG's version id. Statements are batched: one read of the known versions and of the
    DAG rows per BATCH DAGs, one executemany for the new versions, the new DAGs and the DAGs
    whose registered fields changed (an unchanged DAG is not written at all)."""
    from treadle.domain.dag_version import content_digest  # not at import: `runs list` needs none

    forms = {s.dag_id: s.to_json() for s in structures}  # built once, for the hash and the row
    digests = {dag_id: content_digest(form) for dag_id, form in forms.items()}
    versions = _version_ids(conn, digests)
    new = [s for s in structures if s.dag_id not in versions]
    if new:
        conn.execute(
            sa.insert(dag_versions),
            [
                {
                    "dag_id": s.dag_id,
                    "version_hash": digests[s.dag_id],
                    "structure": forms[s.dag_id],
                    "created_at": now,
                }
                for s in new
            ],
        )
        versions.update(_version_ids(conn, {s.dag_id: digests[s.dag_id] for s in new}))
    current = _registered(conn, [s.dag_id for s in structures])
    inserts: list[dict[str, object]] = []
    updates: list[dict[str, object]] = []
    for s in structures:
        values = _registered_values(s, versions[s.dag_id])
        found = current.get(s.dag_id)
        if found is None:
            inserts.append({"dag_id": s.dag_id, **values, "updated_at": now})
        elif found != values:
            updates.append({"key": s.dag_id, **values, "updated_at": now})
    if inserts:
        conn.execute(sa.insert(dags), inserts)
    if updates:
        stmt = sa.update(dags).where(dags.c.dag_id == sa.bindparam("key"))
        conn.execute(stmt.values({c: sa.bindparam(c) for c in updates[0] if c != "key"}), updates)
    return versions


#: The columns of `dags` a sync writes from a structure (with updated_at).
_REGISTERED = (
    "owner",
    "description",
    "tags",
    "fileloc",
    "latest_version_id",
    "max_active_tasks",
    "team",
    "is_active",
)


def _registered_values(structure: DagStructure, version_id: int) -> dict[str, object]:
    return {
        "owner": structure.owner,
        "description": structure.description,
        "tags": list(structure.tags),
        "fileloc": structure.fileloc,
        "latest_version_id": version_id,
        "max_active_tasks": structure.max_active_tasks,
        "team": structure.team,
        "is_active": True,
    }


def _registered(conn: Connection, dag_ids: Sequence[str]) -> dict[str, dict[str, object]]:
    """The registered fields of those DAGs that have a row, by id."""
    found: dict[str, dict[str, object]] = {}
    columns = [dags.c[c] for c in _REGISTERED]
    for chunk in _chunks(dag_ids):
        for row in conn.execute(sa.select(dags.c.dag_id, *columns).where(dags.c.dag_id.in_(chunk))):
            m = row._mapping
            found[m["dag_id"]] = {
                **{c: m[c] for c in _REGISTERED},
                "tags": list(m["tags"] or ()),
                "is_active": bool(m["is_active"]),
            }
    return found


def _version_ids(conn: Connection, digests: dict[str, str]) -> dict[str, int]:
    """Ids of the versions with these (DAG id, content hash) pairs that exist, by DAG id."""
    found: dict[str, int] = {}
    key = sa.tuple_(dag_versions.c.dag_id, dag_versions.c.version_hash)
    for chunk in _chunks(list(digests.items())):
        stmt = sa.select(dag_versions.c.dag_id, dag_versions.c.id).where(key.in_(chunk))
        found.update({r.dag_id: int(r.id) for r in conn.execute(stmt)})
    return found


def deactivate_missing(
    conn: Connection,
    *,
    present: Iterable[str],
    scanned: Iterable[str],
    failed: Iterable[str],
    folder: str | None,
    now: datetime,
) -> list[tuple[str, str]]:
    """Mark inactive the active DAGs a folder pass should have found and did not: those whose
    file was imported cleanly (`scanned`) or, for a full pass of `folder`, lies under it, but
    which no structure of the pass (`present`) defines. A file that failed to import (`failed`)
    keeps its DAGs active: its load error says what is wrong. Returns (dag id, file) of each."""
    present, scanned, failed = set(present), set(scanned), set(failed)
    prefix = folder.rstrip("/") + "/" if folder is not None else None
    rows = conn.execute(sa.select(dags.c.dag_id, dags.c.fileloc).where(dags.c.is_active == sa.true()))
    gone = [
        (r.dag_id, r.fileloc)
        for r in rows
        if r.dag_id not in present
        and r.fileloc not in failed
        and (r.fileloc in scanned or (prefix is not None and r.fileloc.startswith(prefix)))
    ]
    for chunk in _chunks([dag_id for dag_id, _ in gone]):
        conn.execute(sa.update(dags).where(dags.c.dag_id.in_(chunk)).values(is_active=False, updated_at=now))
    return sorted(gone)


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
    prefix = folder.rstrip("/") + "/" if folder is not None else None
    recorded = conn.execute(sa.select(dag_load_errors.c.fileloc)).scalars()
    stale = sorted(f for f in recorded if f in scanned or (prefix is not None and f.startswith(prefix)))
    for chunk in _chunks(stale):
        conn.execute(sa.delete(dag_load_errors).where(dag_load_errors.c.fileloc.in_(chunk)))
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
        is_active=bool(m["is_active"]),
    )


def list_dags(conn: Connection) -> list[DagInfo]:
    """Return every registered DAG, by id."""
    return [_dag_info(r) for r in conn.execute(_dag_select().order_by(dags.c.dag_id))]


def get_dag(conn: Connection, dag_id: str) -> DagInfo | None:
    """Return one DAG, or None."""
    row = conn.execute(_GET_DAG, {"dag_id": dag_id}).first()
    return _dag_info(row) if row else None


#: Built once (every trigger reads its DAG): the dag id is bound per call.
_GET_DAG = _dag_select().where(dags.c.dag_id == sa.bindparam("dag_id"))


def get_structure(conn: Connection, version_id: int) -> DagStructure:
    """Return the serialized structure of a DAG version (versions never change)."""
    from treadle.domain.dag_version import DagStructure

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
    from treadle.domain.dag_version import DagStructure

    rows = conn.execute(
        sa.select(dag_versions.c.id, dag_versions.c.structure, dag_versions.c.version_hash).where(
            dag_versions.c.id.in_(version_ids)
        )
    )
    return {r.id: (DagStructure.from_json(r.structure), r.version_hash) for r in rows}


def get_params_schemas(conn: Connection, version_ids: list[int]) -> dict[int, dict[str, Any] | None]:
    """Return the params schemas of several DAG versions by version id, read from their stored
    structures without building them (masking secret params needs nothing else)."""
    rows = conn.execute(
        sa.select(dag_versions.c.id, dag_versions.c.structure).where(dag_versions.c.id.in_(version_ids))
    )
    return {r.id: params_schema_in(r.structure) for r in rows}
