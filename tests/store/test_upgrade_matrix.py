"""Upgrades keep data: a database at every released revision, filled as it was then, upgraded to head.

For each revision R the code knows and each dialect: migrate an empty database to R, insert rows
with plain SQL into the tables as they are at R (reflected, so only columns that existed then),
upgrade to head, and check every row kept its values, new NOT NULL columns got their defaults,
and treadle's read paths (run listing, run detail, `why`, dead letters) work on the result.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import _admin, _mysql_admin, _mysql_create, _mysql_drop, _mysql_url, _pg_url
from treadle import dag, task
from treadle.domain.dag_version import DagStructure
from treadle.domain.states import TERMINAL_TASK_STATES, RunState, TaskState
from treadle.engine import dead_letters, diagnosis, queries
from treadle.store import migrate
from treadle.store.database import Database
from treadle.store.tables import metadata as head_metadata

T0 = datetime(2026, 1, 1, 10, 0, 0, 123456, tzinfo=UTC)

#: Task states that did not exist before a revision (the state column is free text, so the
#: revision that brought the state's columns is the first one a database could hold it in).
STATE_SINCE = {TaskState.UP_FOR_RESCHEDULE: "0009", TaskState.NEEDS_INSPECTION: "0006"}

#: The task state each run holds in its one task, besides the running run holding every state.
RUN_TASK_STATE = {
    RunState.QUEUED: TaskState.PENDING,
    RunState.SUCCESS: TaskState.SUCCESS,
    RunState.FAILED: TaskState.DEAD_LETTER,
    RunState.CANCELLED: TaskState.CANCELLED,
}

DIALECTS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


def _states_at(revision: str) -> list[TaskState]:
    return [s for s in TaskState if STATE_SINCE.get(s, "0000") <= revision]


def _noop() -> None:
    return None


def _structure(states: list[TaskState]) -> DagStructure:
    """A DAG with one independent task per task state (task id = the state's name)."""
    tasks = [task(task_id=s.value)(_noop) for s in states]

    @dag(dag_id="legacy")
    def legacy() -> None:
        for t in tasks:
            t()

    structure: DagStructure = legacy().structure()
    return structure


def _task_instance(ti_id: int, run_id: str, state: TaskState, at: datetime) -> dict[str, Any]:
    started = state not in (TaskState.PENDING, TaskState.QUEUED)
    row: dict[str, Any] = {
        "id": ti_id,
        "run_id": run_id,
        "dag_id": "legacy",
        "task_id": state.value,
        "map_index": -1,
        "state": state.value,
        "attempt": 1 if started else 0,
        "budget_base": 0,
        "orphaned_count": 0,
        "queue": "default",
        "priority_weight": 3,
        "upstream_total": 0,
        "upstream_done": 0,
        "queued_at": at if state != TaskState.PENDING else None,
        "started_at": at + timedelta(seconds=1) if started else None,
        "ended_at": at + timedelta(seconds=5) if state in TERMINAL_TASK_STATES else None,
        "timeout_s": 30.5,
        "dead_letter_reason": "retries_exhausted" if state == TaskState.DEAD_LETTER else None,
    }
    if state in (TaskState.RUNNING, TaskState.NEEDS_INSPECTION):
        row |= {"worker_id": "w-old", "hostname": "host-a", "lease_expires_at": at + timedelta(minutes=5)}
    if state == TaskState.RETRY_WAIT:
        row["next_attempt_at"] = at + timedelta(minutes=1)
    if state == TaskState.UP_FOR_RESCHEDULE:
        row |= {"next_attempt_at": at + timedelta(minutes=1), "first_poke_at": at}
    return row


def _attempt(attempt_id: int, ti: dict[str, Any]) -> dict[str, Any] | None:
    """The attempt a started task instance recorded (none while its first attempt runs)."""
    outcome = {
        TaskState.SUCCESS.value: "success",
        TaskState.DEAD_LETTER.value: "failed",
        TaskState.RETRY_WAIT.value: "failed",
        TaskState.CANCELLED.value: "cancelled",
        TaskState.UP_FOR_RESCHEDULE.value: "rescheduled",
        TaskState.NEEDS_INSPECTION.value: "unknown_commit",
    }.get(ti["state"])
    if outcome is None or ti["started_at"] is None:
        return None
    failed = outcome != "success"
    return {
        "id": attempt_id,
        "task_instance_id": ti["id"],
        "run_id": ti["run_id"],
        "dag_id": "legacy",
        "task_id": ti["task_id"],
        "attempt": 1,
        "outcome": outcome,
        "error_type": "ValueError" if failed else None,
        "error_message": "bad row 7" if failed else None,
        "traceback": "Traceback (most recent call last):\n  ...\nValueError: bad row 7" if failed else None,
        "fingerprint": "f" * 40 if failed else None,
        "worker_id": "w-old",
        "hostname": "host-a",
        "started_at": ti["started_at"],
        "ended_at": ti["started_at"] + timedelta(seconds=2),
        "duration_s": 2.25,
        "retry_delay_s": 60.0 if ti["state"] == TaskState.RETRY_WAIT.value else None,
        "exit_code": 1 if failed else 0,
        "code_version": "abc123",
        "outputs": {"rows": 7},
    }


def _core_rows(revision: str) -> dict[str, list[dict[str, Any]]]:
    """Rows of the tables every revision has, in every state that exists at `revision`."""
    states = _states_at(revision)
    structure = _structure(states)
    rows: dict[str, list[dict[str, Any]]] = {
        "dags": [
            {
                "dag_id": "legacy",
                "owner": "ops",
                "description": "made by an old treadle",
                "tags": ["old", "etl"],
                "fileloc": "/dags/legacy.py",
                "is_paused": False,
                "is_active": True,
                "latest_version_id": 1,
                "updated_at": T0,
            }
        ],
        "dag_versions": [
            {
                "id": 1,
                "dag_id": "legacy",
                "version_hash": structure.content_hash(),
                "structure": structure.to_json(),
                "created_at": T0,
            }
        ],
        "dag_runs": [],
        "task_instances": [],
        "task_attempts": [],
        "task_results": [],
        "workers": [
            {
                "worker_id": "w-old",
                "hostname": "host-a",
                "pid": 4242,
                "queues": ["default"],
                "concurrency": 4,
                "state": "running",
                "started_at": T0,
                "last_heartbeat_at": T0 + timedelta(seconds=30),
            }
        ],
    }
    for i, run_state in enumerate(RunState):
        at = T0 + timedelta(hours=i)
        run_id = f"run_{run_state.value}"
        rows["dag_runs"].append(
            {
                "run_id": run_id,
                "dag_id": "legacy",
                "dag_version_id": 1,
                "run_type": "manual",
                "logical_date": at,
                "state": run_state.value,
                "conf": {"n": i, "note": "ünïcode"},
                "triggered_by": "cli",
                "created_at": at,
                "started_at": None if run_state == RunState.QUEUED else at,
                "ended_at": at + timedelta(minutes=1)
                if run_state.value in ("success", "failed", "cancelled")
                else None,
            }
        )
        held = states if run_state == RunState.RUNNING else [RUN_TASK_STATE[run_state]]
        for state in held:
            ti = _task_instance(len(rows["task_instances"]) + 1, run_id, state, at)
            rows["task_instances"].append(ti)
            attempt = _attempt(len(rows["task_attempts"]) + 1, ti)
            if attempt is not None:
                rows["task_attempts"].append(attempt)
            if state == TaskState.SUCCESS:
                rows["task_results"].append(
                    {
                        "task_instance_id": ti["id"],
                        "run_id": run_id,
                        "task_id": ti["task_id"],
                        "value": {"total": 10, "items": [1, 2]},
                        "size_bytes": 30,
                        "created_at": ti["ended_at"],
                    }
                )
    return rows


def _generic_value(column: sa.Column[Any], head_column: sa.Column[Any] | None) -> Any:
    """A value for a column of a table this test has no hand-written rows for."""
    kind = (head_column if head_column is not None else column).type
    if isinstance(kind, sa.TypeDecorator):
        kind = kind.impl if isinstance(kind.impl, sa.types.TypeEngine) else kind.impl()
    if isinstance(kind, sa.JSON):
        return {"kept": [1, "two"]}
    if isinstance(kind, sa.Boolean):
        return True
    if isinstance(kind, sa.DateTime):
        return T0 + timedelta(minutes=7)
    if isinstance(kind, sa.Float):
        return 4.5
    if isinstance(kind, sa.Integer):
        return 7
    if isinstance(kind, sa.LargeBinary):
        return b"\x00\x01bytes"
    if isinstance(kind, sa.String):
        length = kind.length or 250
        return f"{column.name}-v"[:length]
    raise AssertionError(f"no generic value for {column.table.name}.{column.name} ({kind!r})")


def _for_insert(value: Any, column: sa.Column[Any], dialect: str) -> Any:
    """A logical value as a plain insert into the reflected column takes it."""
    if isinstance(value, datetime) and dialect != "postgresql":
        return value.astimezone(UTC).replace(tzinfo=None)
    if isinstance(value, dict | list) and not isinstance(column.type, sa.JSON):
        return json.dumps(value)  # MariaDB's JSON is LONGTEXT with a check
    return value


def _fill(db: Database, revision: str) -> dict[str, list[dict[str, Any]]]:
    """Insert rows into every table at `revision`; return them as inserted (logical values)."""
    core = _core_rows(revision)
    inserted: dict[str, list[dict[str, Any]]] = {}
    at_rev = sa.MetaData()
    with db.begin() as conn:
        at_rev.reflect(conn)
        for name, table in at_rev.tables.items():
            if name == "alembic_version":
                continue
            head_table = head_metadata.tables[name]
            if name in core:
                wanted = [{k: v for k, v in row.items() if k in table.c} for row in core[name]]
            else:
                wanted = [{c.name: _generic_value(c, head_table.c.get(c.name)) for c in table.c}]
            for row in wanted:
                conn.execute(
                    table.insert().values({k: _for_insert(v, table.c[k], db.dialect) for k, v in row.items()})
                )
            inserted[name] = wanted
    return inserted


def _normal(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, float):
        return round(value, 6)
    return value


def _check_kept(db: Database, inserted: dict[str, list[dict[str, Any]]], revision: str) -> None:
    """Every inserted row is there with its values; new NOT NULL columns hold their defaults."""
    with db.read() as conn:
        for name, rows in inserted.items():
            table = head_metadata.tables[name]
            key = [c.name for c in table.primary_key]
            assert key, f"{name} has no primary key"
            count = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            assert count == len(rows), (
                f"{name}: {count} rows after upgrade from {revision}, {len(rows)} before"
            )
            for row in rows:
                found = conn.execute(
                    sa.select(table).where(*(table.c[k] == row[k] for k in key))
                ).one_or_none()
                assert found is not None, f"{name} row {[row[k] for k in key]} lost upgrading from {revision}"
                got = found._mapping
                for field, value in row.items():
                    assert _normal(got[field]) == _normal(value), (
                        f"{name}.{field} was {value!r}, is {got[field]!r} after upgrading from {revision}"
                    )
                for column in table.c:
                    if column.name in row or column.nullable:
                        continue
                    assert got[column.name] is not None, f"new column {name}.{column.name} is NULL"
                    default = column.server_default
                    if isinstance(default, sa.DefaultClause) and isinstance(default.arg, str):
                        assert str(got[column.name]) == default.arg, (
                            f"new column {name}.{column.name} is {got[column.name]!r}, "
                            f"its default is {default.arg!r}"
                        )


def _check_read_paths(db: Database, inserted: dict[str, list[dict[str, Any]]], revision: str) -> None:
    runs = {r.run_id: r.state for r in queries.list_runs(db)}
    assert runs == {f"run_{s.value}": s.value for s in RunState}
    for run in inserted["dag_runs"]:
        detail = queries.run_detail(db, run["run_id"])
        expected = sorted(t["task_id"] for t in inserted["task_instances"] if t["run_id"] == run["run_id"])
        assert sorted(t.task_id for t in detail.task_instances) == expected
        assert len(detail.attempts) == sum(
            1 for a in inserted["task_attempts"] if a["run_id"] == run["run_id"]
        )
    explained = diagnosis.why(db, "run_running", worker_stale_s=60)
    assert sorted(w.task_id for w in explained) == sorted(s.value for s in _states_at(revision))
    letters = dead_letters.list_dead_letters(db)
    assert sorted(d.task_instance.run_id for d in letters) == ["run_failed", "run_running"]
    assert all(d.last_attempt is not None and d.last_attempt.error_type == "ValueError" for d in letters)


class Snapshots:
    """One database per released revision and dialect, made by walking a single database up the
    chain and copying it at each revision (each revision's migrations run once, not once per
    revision above it). Each test takes one snapshot and upgrades it; all are dropped at the end."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self._request = request
        self._tmp_path = tmp_path
        self._made: dict[str, dict[str, str]] = {}
        self._drop: list[tuple[str, str]] = []

    def url(self, dialect: str, revision: str) -> str:
        if dialect not in self._made:
            self._made[dialect] = self._walk(dialect)
        return self._made[dialect][revision]

    def _walk(self, dialect: str) -> dict[str, str]:
        if dialect != "sqlite":
            self._request.getfixturevalue("pg_template" if dialect == "postgresql" else "mysql_template")
        tag = uuid.uuid4().hex[:8]
        ladder = self._create(dialect, f"u_{tag}_ladder")
        urls: dict[str, str] = {}
        for revision in migrate.known_revisions():
            db = Database(ladder)
            try:
                migrate.upgrade(db, revision)
            finally:
                db.dispose()
            urls[revision] = self._copy(dialect, ladder, f"u_{tag}_{revision}")
        self.drop(ladder)
        return urls

    def _create(self, dialect: str, name: str) -> str:
        if dialect == "sqlite":
            return f"sqlite:///{self._tmp_path / f'{name}.db'}"
        self._drop.append((dialect, name))
        if dialect == "mysql":
            _mysql_create(name)
            return _mysql_url(name)
        with _admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return _pg_url(name)

    def _copy(self, dialect: str, source_url: str, name: str) -> str:
        source = sa.engine.make_url(source_url).database
        if dialect == "sqlite":
            target = self._tmp_path / f"{name}.db"
            shutil.copy(str(source), target)
            return f"sqlite:///{target}"
        self._drop.append((dialect, name))
        if dialect == "postgresql":
            with _admin() as conn:
                conn.execute(f"CREATE DATABASE {name} TEMPLATE {source}")
            return _pg_url(name)
        _mysql_create(name)
        with _mysql_admin() as conn, conn.cursor() as cur:
            cur.execute(f"SHOW TABLES FROM {source}")
            for (table,) in cur.fetchall():
                cur.execute(f"CREATE TABLE {name}.{table} LIKE {source}.{table}")
            cur.execute(f"INSERT INTO {name}.alembic_version SELECT * FROM {source}.alembic_version")
        return _mysql_url(name)

    def drop(self, url: str) -> None:
        """Drop one database as soon as it served (a SQLite file goes with the temporary folder)."""
        name = sa.engine.make_url(url).database
        for dialect, made in list(self._drop):
            if made != name:
                continue
            self._drop.remove((dialect, made))
            if dialect == "mysql":
                _mysql_drop(made)
            else:
                with _admin() as conn:
                    conn.execute(f"DROP DATABASE IF EXISTS {made} WITH (FORCE)")

    def close(self) -> None:
        for _, name in list(self._drop):
            self.drop(f"postgresql:///{name}")


@pytest.fixture(scope="module")
def snapshots(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Snapshots]:
    made = Snapshots(request, tmp_path_factory.mktemp("revisions"))
    yield made
    made.close()


@pytest.mark.parametrize("revision", migrate.known_revisions())
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_database_at_a_released_revision_upgrades_with_its_data(
    snapshots: Snapshots, dialect: str, revision: str
) -> None:
    url = snapshots.url(dialect, revision)
    db = Database(url)
    try:
        assert migrate.current_revision(db) == revision
        inserted = _fill(db, revision)
        migrate.upgrade(db)
        assert migrate.current_revision(db) == migrate.head_revision()
        _check_kept(db, inserted, revision)
        _check_read_paths(db, inserted, revision)
    finally:
        db.dispose()
        snapshots.drop(url)
