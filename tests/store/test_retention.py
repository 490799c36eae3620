"""Retention on SQLite and PostgreSQL: what is pruned, what is kept, dry runs, batches, CLI.

Runs are created and finished through the real engine, then aged by moving `ended_at` back
in time (a test-only UPDATE): the prune itself only ever sees the database clock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from tests.engine.dags_for_tests import four_steps
from treadle.cli.main import cli
from treadle.engine.retention import prune
from treadle.engine.workers import record_worker
from treadle.errors import InvalidRequest
from treadle.scheduler.loop import Scheduler
from treadle.store import alerts as alert_store
from treadle.store import job_cancellations as job_cancels
from treadle.store.database import Database, db_now
from treadle.store.tables import (
    audit_log,
    dag_runs,
    job_cancellations,
    task_attempts,
    task_instances,
    task_map_items,
    task_results,
    workers,
)
from treadle.testing import DagRunner

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
RUN_TABLES = (dag_runs, task_instances, task_attempts, task_results, task_map_items, job_cancellations)


@pytest.fixture
def runner(db_url: str) -> Iterator[DagRunner]:
    """The `four_steps` DAG registered on a fresh database."""
    r = DagRunner(four_steps, database_url=db_url)
    yield r
    r.close()


def trigger(runner: DagRunner) -> str:
    """Trigger a run, then let the database clock tick past its logical date.

    Manual runs are unique per (dag, logical date = database time) and SQLite's clock has
    millisecond resolution, so two triggers inside one millisecond would collide.
    """
    run_id = runner.trigger()
    triggered_at = runner.db.query(db_now)
    while runner.db.query(db_now) <= triggered_at:
        pass
    return run_id


def finished_runs(runner: DagRunner, n: int) -> list[str]:
    """Trigger and finish `n` runs; returns their ids."""
    ids = [trigger(runner) for _ in range(n)]
    for run_id in ids:
        assert runner.run_until_done(run_id).state == "success"
    return ids


def set_run(db: Database, run_ids: list[str], **values: object) -> None:
    """Test-only write: move runs back in time or into another state."""
    with db.begin() as conn:
        conn.execute(sa.update(dag_runs).where(dag_runs.c.run_id.in_(run_ids)).values(**values))


def rows_of(db: Database, run_ids: list[str]) -> dict[str, int]:
    """Rows per run table that belong to the given runs."""
    with db.read() as conn:
        return {
            t.name: conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.run_id.in_(run_ids))
            ).scalar_one()
            for t in RUN_TABLES
        }


def all_rows(db: Database) -> dict[str, int]:
    """Rows in every table retention may touch."""
    with db.read() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (*RUN_TABLES, audit_log, workers)
        }


def add_audit_entry(db: Database, *, at: datetime, action: str) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.insert(audit_log).values(at=at, actor="cli:test", action=action, target="run:x", details={})
        )


def add_worker(db: Database, worker_id: str, *, last_heartbeat_at: datetime | None, state: str) -> None:
    record_worker(db, worker_id=worker_id, hostname="h", pid=1, queues=["default"], concurrency=1)
    values: dict[str, object] = {"state": state}
    if last_heartbeat_at is not None:
        values["last_heartbeat_at"] = last_heartbeat_at
    with db.begin() as conn:
        conn.execute(sa.update(workers).where(workers.c.worker_id == worker_id).values(**values))


def owe_job_cancel(db: Database, run_id: str) -> None:
    """Record an owed cancel of an external job for the run's first task instance."""
    with db.begin() as conn:
        instance = conn.execute(
            sa.select(task_instances, dag_runs.c.dag_version_id)
            .join(dag_runs, dag_runs.c.run_id == task_instances.c.run_id)
            .where(task_instances.c.run_id == run_id)
            .order_by(task_instances.c.id)
        ).first()
        assert instance is not None
        job_cancels.request(
            conn,
            task_instance_id=instance.id,
            run_id=run_id,
            dag_id=instance.dag_id,
            task_id=instance.task_id,
            dag_version_id=instance.dag_version_id,
            queue=instance.queue,
            handle={"pid": 1},
            reason="run cancelled",
            now=db_now(conn),
        )


@dataclass
class History:
    """Old and recent rows of every kind, with the ids of what must go and what must stay."""

    old: list[str]
    kept: list[str]
    old_rows: dict[str, int]
    kept_rows: dict[str, int]


@pytest.fixture
def history(runner: DagRunner) -> History:
    db = runner.db
    old_success, old_failed, old_cancelled, recent = finished_runs(runner, 4)
    old = [old_success, old_failed, old_cancelled]
    set_run(db, old, ended_at=LONG_AGO)
    set_run(db, [old_failed], state="failed")
    set_run(db, [old_cancelled], state="cancelled")
    kept = [recent]
    owe_job_cancel(db, old_cancelled)
    owe_job_cancel(db, recent)
    # Old in every column but not terminal: the positive evidence is missing, so they stay.
    for state in ("queued", "running"):
        active = trigger(runner)
        set_run(db, [active], state=state, created_at=LONG_AGO, started_at=LONG_AGO, ended_at=LONG_AGO)
        kept.append(active)
    add_audit_entry(db, at=LONG_AGO, action="old")
    add_audit_entry(db, at=db.query(db_now), action="recent")
    add_worker(db, "gone", last_heartbeat_at=LONG_AGO, state="stopped")
    add_worker(db, "dead", last_heartbeat_at=LONG_AGO, state="running")
    add_worker(db, "alive", last_heartbeat_at=None, state="running")
    return History(old=old, kept=kept, old_rows=rows_of(db, old), kept_rows=rows_of(db, kept))


def test_old_finished_runs_go_with_all_their_rows_and_the_rest_stays(
    runner: DagRunner, history: History
) -> None:
    db = runner.db
    assert len(history.kept) == 3
    # four_steps maps nothing, so it has no task_map_items rows (their pruning: test_mapping.py).
    assert all(n > 0 for t, n in history.old_rows.items() if t != "task_map_items"), history.old_rows

    report = prune(db, older_than=timedelta(days=1), audit_older_than=timedelta(days=1))

    assert not report.dry_run
    assert report.rows.by_table() == {
        **history.old_rows,
        "audit_log": 1,
        "workers": 2,
        "idempotency_keys": 0,
        "alert_firings": 0,
    }
    assert rows_of(db, history.old) == dict.fromkeys(history.old_rows, 0)
    assert rows_of(db, history.kept) == history.kept_rows
    with db.read() as conn:
        # Triggers are audited too (all recent): only the two hand-made entries are looked at.
        hand_made = sa.select(audit_log.c.action).where(audit_log.c.action.in_(("old", "recent")))
        assert list(conn.execute(hand_made).scalars()) == ["recent"]
        assert list(conn.execute(sa.select(workers.c.worker_id)).scalars()) == ["alive"]
    # The cutoff comes from the database clock.
    assert abs((db.query(db_now) - timedelta(days=1)) - report.cutoff) < timedelta(minutes=1)
    # Nothing old is left: a second prune deletes nothing.
    assert prune(db, older_than=timedelta(days=1)).rows.total == 0


def test_dry_run_deletes_nothing_and_counts_what_a_prune_deletes(runner: DagRunner, history: History) -> None:
    db = runner.db
    before = all_rows(db)

    dry = prune(db, older_than=timedelta(days=1), audit_older_than=timedelta(days=1), dry_run=True)

    assert dry.dry_run and dry.batches == 0 and not dry.deleted_anything
    assert all_rows(db) == before
    real = prune(db, older_than=timedelta(days=1), audit_older_than=timedelta(days=1))
    assert real.deleted_anything
    assert dry.rows == real.rows
    assert dry.rows.by_table() == {
        **history.old_rows,
        "audit_log": 1,
        "workers": 2,
        "idempotency_keys": 0,
        "alert_firings": 0,
    }


def test_pruning_goes_in_batches_of_short_transactions(runner: DagRunner) -> None:
    db = runner.db
    old = finished_runs(runner, 5)
    set_run(db, old, ended_at=LONG_AGO)
    expected = rows_of(db, old)
    commits: list[int] = []
    sa.event.listen(db.engine, "commit", lambda _conn: commits.append(1))

    report = prune(db, older_than=timedelta(hours=1), batch_runs=2)

    # Batches of 2, 2 and 1 runs, each its own transaction, then one that finds nothing.
    assert report.batches == 3
    assert len(commits) >= 3
    assert report.rows.dag_runs == 5
    assert report.rows.by_table() == {
        **expected,
        "audit_log": 0,
        "workers": 0,
        "idempotency_keys": 0,
        "alert_firings": 0,
    }
    assert rows_of(db, old) == dict.fromkeys(expected, 0)


def test_max_batches_stops_after_one_batch(runner: DagRunner) -> None:
    db = runner.db
    old = finished_runs(runner, 3)
    set_run(db, old, ended_at=LONG_AGO)

    report = prune(db, older_than=timedelta(hours=1), batch_runs=2, max_batches=1)

    assert (report.batches, report.rows.dag_runs) == (1, 2)
    # The oldest go first.
    assert rows_of(db, old)["dag_runs"] == 1


def _audit_entries(db: Database) -> list[tuple[object, ...]]:
    with db.read() as conn:
        return [tuple(r) for r in conn.execute(sa.select(audit_log).order_by(audit_log.c.id))]


def test_the_audit_log_is_kept_unless_its_own_longer_retention_is_given(
    runner: DagRunner, history: History
) -> None:
    db = runner.db
    add_audit_entry(db, at=db.query(db_now) - timedelta(days=10), action="ten days old")
    before = _audit_entries(db)

    runs_only = prune(db, older_than=timedelta(days=1))

    assert runs_only.rows.dag_runs == 3 and runs_only.rows.audit_log == 0
    assert runs_only.audit_cutoff is None
    assert _audit_entries(db) == before  # not one entry deleted or changed

    with pytest.raises(InvalidRequest, match="may not be shorter"):
        prune(db, older_than=timedelta(days=30), audit_older_than=timedelta(days=1))

    audit_only = prune(db, older_than=None, audit_older_than=timedelta(days=30))

    assert audit_only.rows.by_table() == {
        **dict.fromkeys(history.old_rows, 0),
        "audit_log": 1,
        "workers": 0,
        "idempotency_keys": 0,
        "alert_firings": 0,
    }
    after = _audit_entries(db)
    # Only the entry older than 30 days went; every other entry is exactly as it was.
    assert [e for e in before if e not in after] == [next(e for e in before if e[3] == "old")]
    assert all(e in before for e in after)


def test_the_scheduler_prunes_the_audit_log_on_its_own_retention(runner: DagRunner) -> None:
    db = runner.db
    old = finished_runs(runner, 1)
    set_run(db, old, ended_at=LONG_AGO)
    add_audit_entry(db, at=LONG_AGO, action="old")
    scheduler = Scheduler(db, tick_s=0.1, retention_days=30, audit_retention_days=3650)

    report = scheduler.prune_step()

    assert report is not None and report.rows.dag_runs == 1 and report.rows.audit_log == 0
    assert report.audit_cutoff is not None
    assert "old" in [e[3] for e in _audit_entries(db)]


@pytest.mark.parametrize("age", [timedelta(0), timedelta(days=-1)])
def test_non_positive_age_is_rejected(db: Database, age: timedelta) -> None:
    with pytest.raises(InvalidRequest, match="positive"):
        prune(db, older_than=age)


def test_scheduler_prunes_one_batch_on_its_first_pass_then_waits(
    runner: DagRunner, caplog: pytest.LogCaptureFixture
) -> None:
    db = runner.db
    old = finished_runs(runner, 2)
    set_run(db, old, ended_at=LONG_AGO)
    assert Scheduler(db, tick_s=0.1).prune_step() is None  # retention off by default

    scheduler = Scheduler(db, tick_s=0.1, retention_days=30)
    with caplog.at_level(logging.INFO, logger="treadle.scheduler"):
        report = scheduler.prune_step()

    assert report is not None and report.batches == 1 and report.rows.dag_runs == 2
    assert rows_of(db, old)["dag_runs"] == 0
    events = [r for r in caplog.records if getattr(r, "event", None) == "retention.pruned"]
    assert len(events) == 1 and events[0].dag_runs == 2  # type: ignore[attr-defined]
    # The next batch waits for the retention interval, however often the loop ticks.
    assert scheduler.prune_step() is None


def _prune(args: list[str], *, database_url: str, home: Path) -> Result:
    """`treadle db prune ARGS` in this process: the CLI's parsing, output and exit codes, without
    a process start per call (the e2e suite prunes through a real process)."""
    env = {"TREADLE_DATABASE_URL": database_url, "TREADLE_HOME": str(home)}
    return CliRunner().invoke(cli, ["db", "prune", *args], env=env)


def test_cli_prune_dry_run_then_prune_then_bad_values(sqlite_url: str, tmp_path: Path) -> None:
    runner = DagRunner(four_steps, database_url=sqlite_url)
    try:
        old = finished_runs(runner, 1)
        set_run(runner.db, old, ended_at=LONG_AGO)
        expected = rows_of(runner.db, old)
    finally:
        runner.close()
    home = tmp_path / "home"
    args = ["--older-than", "1s", "--json"]

    dry = _prune([*args, "--dry-run"], database_url=sqlite_url, home=home)
    assert dry.exit_code == 0, dry.output
    dry_report = json.loads(dry.stdout)
    assert dry_report["dry_run"] is True
    assert {k: dry_report["rows"][k] for k in expected} == expected

    done = _prune(args, database_url=sqlite_url, home=home)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["rows"] == dry_report["rows"]
    check = Database(sqlite_url)
    try:
        assert rows_of(check, old) == dict.fromkeys(expected, 0)
    finally:
        check.dispose()

    table = _prune(["--older-than", "90d", "--dry-run"], database_url=sqlite_url, home=home)
    assert table.exit_code == 0, table.output
    assert "Would delete (dry run)" in table.stdout and "dag_runs" in table.stdout

    for bad in ("90x", "0d", "-1d"):
        failed = _prune(["--older-than", bad], database_url=sqlite_url, home=home)
        assert failed.exit_code == 1, (bad, failed.output)
        assert failed.stderr.startswith("error: invalid duration"), failed.stderr
        assert "90d" in failed.stderr or "greater than zero" in failed.stderr


def test_pruned_runs_lose_their_files_and_kept_runs_keep_them(sqlite_url: str, tmp_path: Path) -> None:
    from treadle.authoring.artifacts import Artifacts, run_folder

    home = tmp_path / "home"
    runner = DagRunner(four_steps, database_url=sqlite_url)
    try:
        old, recent = finished_runs(runner, 2)
        set_run(runner.db, [old], ended_at=LONG_AGO)
    finally:
        runner.close()
    for run_id in (old, recent):
        Artifacts(run_id=run_id, task_id="t", home=home).put("a", b"1")
    done = _prune(["--older-than", "30d", "--json"], database_url=sqlite_url, home=home)
    assert done.exit_code == 0, done.output
    assert not run_folder(home, old).exists()
    assert (run_folder(home, recent) / "artifacts" / "t" / "a").exists()


def test_alert_firings_go_once_past_the_dedup_window_and_the_history_cutoff_with_their_run(
    runner: DagRunner,
) -> None:
    old, kept = finished_runs(runner, 2)
    set_run(runner.db, [old], ended_at=LONG_AGO)
    now = runner.db.query(db_now)

    def firing(name: str, *, run_id: str | None, ago: timedelta) -> alert_store.Firing:
        return alert_store.Firing(
            key=name,
            rule="system:run_over_budget:abc",
            subject=f"four_steps/{name}",
            kind="run_over_budget",
            dag_id="four_steps",
            run_id=run_id,
            disposition="sent",
            fired_at=now - ago,
        )

    rows = [
        firing("of-pruned-run", run_id=old, ago=timedelta(hours=2)),
        firing("of-kept-run", run_id=kept, ago=timedelta(days=3000)),
        firing("of-gone-run", run_id="never-existed", ago=timedelta(hours=2)),
        firing("runless-old", run_id=None, ago=timedelta(hours=2)),
        # Older than the 10-minute history cutoff but within the 1-hour default dedup window.
        firing("runless-in-window", run_id=None, ago=timedelta(minutes=30)),
        firing("of-pruned-run-in-window", run_id=old, ago=timedelta(minutes=30)),
    ]
    with runner.db.begin() as conn:
        for row in rows:
            alert_store.record(conn, row)

    dry = prune(runner.db, older_than=timedelta(minutes=10), dry_run=True)
    assert dry.rows.alert_firings == 3 and dry.rows.dag_runs == 1
    # The longer of the history's 10 minutes and the default 1-hour dedup window.
    assert dry.cutoff is not None and dry.firings_cutoff == dry.cutoff - timedelta(minutes=50)
    report = prune(runner.db, older_than=timedelta(minutes=10))
    assert report.rows.alert_firings == 3 and report.rows.dag_runs == 1
    left = {f.key for f in runner.db.query(lambda conn: alert_store.firings(conn))}
    assert left == {"of-kept-run", "runless-in-window", "of-pruned-run-in-window"}
    # Without a history retention nothing of the alerts goes.
    assert prune(runner.db, older_than=None, audit_older_than=timedelta(days=1)).rows.alert_firings == 0
