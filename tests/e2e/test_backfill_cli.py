"""`treadle backfill` and `treadle backfills` as real processes: dry run, validation messages and
exit codes, list/show/pause/unpause/cancel, and the progress watcher (cancel and Ctrl-C)."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

HOURLY_DAG = """
    from __future__ import annotations

    from datetime import timedelta

    from treadle import dag, task


    @task
    def extract() -> int:
        return 1


    @dag(dag_id="hourly", schedule=timedelta(hours=1), start_date=__START__, max_active_runs=4)
    def hourly() -> None:
        extract()


    @dag(dag_id="manual")
    def manual() -> None:
        extract()
"""

START = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=3)


def _k(n: int) -> str:
    """The n-th hourly logical date, naive ISO (read in the DAG's zone, UTC)."""
    return (START + timedelta(hours=n)).strftime("%Y-%m-%dT%H:%M:%S")


def _setup(c: Cluster) -> None:
    c.write_dag("hourly.py", HOURLY_DAG, start=START.isoformat())
    synced = c.cli("dags", "sync")
    assert synced.returncode == 0, synced.stderr


def test_dry_run_validation_and_operator_commands(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(sqlite_url, TREADLE_BACKFILL_MAX_SPAN_DAYS="2")
    _setup(c)

    dry = c.cli("backfill", "hourly", "--from", _k(1), "--to", _k(5), "--reason", "reload", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: backfill of hourly (UTC), 5 interval(s)" in dry.stdout
    assert sum(line.endswith(" create") for line in dry.stdout.splitlines()) == 5, dry.stdout
    first = (START + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    second = (START + timedelta(hours=2)).strftime("%Y-%m-%d %H:%M:%S")
    assert f"{first} UTC -> {second} UTC" in dry.stdout
    assert "would handle 5 interval(s): 5 create; nothing was recorded (dry run)" in dry.stdout
    plan = c.cli_json("backfill", "hourly", "--from", _k(1), "--to", _k(5), "--reason", "r", "--dry-run")
    assert plan["total"] == 5 and plan["dry_run"] is True
    assert [i["action"] for i in plan["intervals"]] == ["create"] * 5
    assert plan["intervals"][0]["data_interval_end"] == plan["intervals"][1]["logical_date"]
    assert c.cli_json("backfills", "list") == []

    base = ("backfill", "hourly", "--no-wait")
    bad_inputs = {
        (*base, "--from", _k(5), "--to", _k(2), "--reason", "r"): "is after --to",
        (*base, "--from", _k(1), "--to", _k(60), "--reason", "r"): (
            "more than the limit of 2 days (setting TREADLE_BACKFILL_MAX_SPAN_DAYS)"
        ),
        (*base, "--from", _k(1), "--to", _k(2)): "error: a backfill needs a reason (--reason TEXT)",
        (*base, "--from", _k(1), "--to", _k(2), "--reason", "  "): "needs a reason",
        (*base, "--from", _k(1), "--to", _k(2), "--reason", "r", "--max-active", "0"): (
            "--max-active must be between 1 and the DAG's max_active_runs (4), got 0"
        ),
        (*base, "--from", _k(1), "--to", _k(2), "--reason", "r", "--max-active", "9"): "(4), got 9",
        (*base, "--from", _k(1), "--to", _k(2), "--reason", "r", "--rerun-failed", "--rerun-all"): (
            "--rerun-failed and --rerun-all exclude each other"
        ),
        (*base, "--from", _k(-9), "--to", _k(-2), "--reason", "r"): "no interval of DAG 'hourly'",
        (
            *base,
            "--from",
            "yesterday",
            "--to",
            _k(2),
            "--reason",
            "r",
        ): "--from 'yesterday' is not an ISO-8601",
        (
            "backfill",
            "manual",
            "--from",
            _k(1),
            "--to",
            _k(2),
            "--reason",
            "r",
        ): "DAG 'manual' has no schedule",
        ("backfill", "nope", "--from", _k(1), "--to", _k(2), "--reason", "r"): "error: no DAG 'nope'",
        ("backfills", "show", "42"): "error: no backfill 42",
        ("backfills", "cancel", "42"): "error: no backfill 42",
    }
    for args, message in bad_inputs.items():
        done = c.cli(*args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
    assert c.cli_json("backfills", "list") == []

    made = c.cli(
        "backfill", "hourly", "--from", _k(1), "--to", _k(10), "--reason", "orders reloaded", "--no-wait"
    )
    assert made.returncode == 0, made.stderr
    assert "backfill 1 created: DAG hourly, 10 interval(s)" in made.stdout
    assert "at most 4 run(s) active" in made.stdout
    listed = c.cli("backfills", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "hourly" in line)
    assert "running" in row and "0/10" in row and "orders reloaded" in row
    [entry] = c.cli_json("backfills", "list", "--dag", "hourly")
    assert entry["backfill"]["state"] == "running" and entry["backfill"]["reason"] == "orders reloaded"
    assert entry["backfill"]["requested_by"].startswith("cli:")
    assert c.cli_json("backfills", "list", "--dag", "manual") == []

    assert c.cli("backfills", "pause", "1").stdout.strip() == "paused backfill 1"
    assert c.cli("backfills", "pause", "1").stdout.strip() == "backfill 1 was already paused"
    assert c.cli_json("backfills", "show", "1")["status"]["backfill"]["state"] == "paused"
    assert c.cli("backfills", "unpause", "1").stdout.strip() == "unpaused backfill 1"
    shown = c.cli("backfills", "show", "1")
    assert shown.returncode == 0, shown.stderr
    assert (
        "backfill 1  dag hourly  state running" in shown.stdout and "reason: orders reloaded" in shown.stdout
    )
    cancelled = c.cli("backfills", "cancel", "1", "--reason", "wrong range")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == "backfill 1 cancelled 0 active run(s) cancelled"
    assert c.cli_json("backfills", "show", "1")["status"]["backfill"]["state"] == "cancelled"
    again = c.cli("backfills", "unpause", "1")
    assert again.returncode == 1 and "backfill 1 has ended (cancelled)" in again.stderr

    # The dry run shows existing backfill runs' intervals too; the cancelled backfill made none.
    created = c.cli_json(
        "backfill", "hourly", "--from", _k(1), "--to", _k(2), "--reason", "r", "--mode", "shadow"
    )
    assert (created["id"], created["mode"], created["total"], created["state"]) == (2, "shadow", 2, "running")


def _wait_backfill(c: Cluster, backfill_id: int) -> None:
    wait_for(
        lambda: any(s["backfill"]["id"] == backfill_id for s in c.cli_json("backfills", "list")),
        timeout=30,
        interval=0.2,
        message=f"backfill {backfill_id} to be recorded",
    )


def test_watcher_ends_on_cancel_and_ctrl_c_only_stops_watching(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url)
    _setup(c)

    watcher = c.start("watch1", "backfill", "hourly", "--from", _k(1), "--to", _k(3), "--reason", "r")
    _wait_backfill(c, 1)
    assert c.cli("backfills", "cancel", "1").returncode == 0
    assert watcher.wait(timeout=30) == 0
    log = c.log("watch1")
    assert "backfill 1 created" in log
    assert "backfill 1 cancelled: 0 success, 0 failed, 0 active, 0 skipped" in log

    watcher = c.start("watch2", "backfill", "hourly", "--from", _k(4), "--to", _k(6), "--reason", "r")
    _wait_backfill(c, 2)
    c.signal("watch2", signal.SIGINT)
    assert watcher.wait(timeout=30) == 0
    log = c.log("watch2")
    assert "stopped watching; backfill 2 goes on" in log
    assert "treadle backfills cancel 2" in log
    assert c.cli_json("backfills", "show", "2")["status"]["backfill"]["state"] == "running"


@pytest.mark.postgres
def test_a_backfill_drains_through_the_scheduler_within_its_budget(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url)
    _setup(c)
    c.start("scheduler", "scheduler")
    c.worker("w1", concurrency=4)
    # Watched to the end: the progress bar returns once every interval has run.
    done = c.cli(
        "backfill", "hourly", "--from", _k(1), "--to", _k(12), "--reason", "reload", "--max-active", "2"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Off a terminal a progress line is printed each time the status changes, not each poll.
    lines = done.stdout.splitlines()
    progress = [line.rsplit(" ", 1)[0] for line in lines if line.startswith("backfill 1 ") and "/12 " in line]
    assert progress and all(a != b for a, b in itertools.pairwise(progress)), lines
    assert lines[-1].startswith("backfill 1 done: 12 success, 0 failed"), lines
    (status,) = c.cli_json("backfills", "list")
    assert status["backfill"]["state"] == "done", status
    assert status["runs_success"] == 12 and status["runs_active"] == 0
    runs = [r for r in c.cli_json("runs", "list", "--limit", "500") if r["run_type"] == "backfill"]
    assert len(runs) == 12
    assert {r["state"] for r in runs} == {"success"}
    starts = sorted(r["logical_date"] for r in runs)
    assert starts[0].startswith(_k(1)[:13]) and len(set(starts)) == 12
    # Never more than 2 of its runs at once: their [started, ended] spans overlap at most pairwise.
    spans = sorted((r["started_at"], r["ended_at"]) for r in runs)
    for i, (start, _) in enumerate(spans):
        overlapping = sum(1 for s, e in spans[:i] if e > start)
        assert overlapping <= 1, spans
