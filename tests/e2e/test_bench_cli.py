"""`treadle bench` runs each workload end to end on fresh processes (SQLite, tiny sizes) and
reports it in its tables and its JSON. Figures are checked for shape and sanity, never speed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e]


def bench(
    tmp_path: Path, *args: str, timeout: float = 240, expect_ok: bool = True
) -> tuple[dict[str, Any], str]:
    """Run `treadle bench ARGS --json FILE`; returns the figures and the printed tables.

    On a timeout the bench gets SIGTERM, which it handles like Ctrl-C: it stops every process
    it started before it exits.
    """
    out = tmp_path / "figures.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "treadle.cli", "bench", *args, "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"treadle bench {' '.join(args)} took over {timeout} s:\n{stderr[-3000:]}")
    assert (proc.returncode == 0) == expect_ok, stderr[-3000:]
    return json.loads(out.read_text()), stdout + stderr


def ordered(figures: dict[str, Any]) -> bool:
    keys = [k for k in ("min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms") if k in figures]
    values = [figures[k] for k in keys]
    return values == sorted(values)


def test_bench_measures_the_chain_on_sqlite_with_its_latency(tmp_path: Path) -> None:
    figures, tables = bench(tmp_path, "--only", "chain", "--reps", "1")
    assert figures["settings"]["database"] == "sqlite"
    assert len(figures["machine"]["load_average_start"]) == 3
    chain = figures["workloads"]["chain-100"]
    assert chain["tasks"] == 100 and len(chain["treadle"]["walls_s"]) == 1
    assert chain["treadle"]["median_wall_s"] > 0
    latency = chain["treadle"]["ready_to_started"]
    assert latency["count"] == 100  # the measured repetition only, not the warm-up
    assert latency["min_ms"] >= 0 and ordered(latency)
    assert "chain-100" in tables and "ready to started" in tables


def test_large_and_huge_runs_report_time_cost_memory_and_flatness(tmp_path: Path) -> None:
    figures, tables = bench(tmp_path, "--only", "run", "--huge", "--big", "200", "--huge-tasks", "600")
    assert list(figures["workloads"]) == ["run-200", "run-600"]
    small, huge = (figures["workloads"][n]["treadle"] for n in ("run-200", "run-600"))
    for run, tasks in ((small, 200), (huge, 600)):
        assert 0 < run["created_s"] < run["wall_s"]
        assert run["tasks_per_s"] > 0 and run["executing_tasks_per_s"] > 0
        assert len(run["tasks_per_s_by_tenth"]) == 10 and min(run["tasks_per_s_by_tenth"]) > 0
        assert run["second_half_over_first_half"] > 0
        assert run["ready_to_started"]["count"] == tasks and ordered(run["ready_to_started"])
        assert run["standalone_cpu_s"] > 0 and run["treadle_cpu_ms_per_task"] > 0
        # The standalone, its fork server and task processes: each sum peaks on its own.
        assert run["peak_rss_mb"] >= run["peak_pss_mb"] >= run["peak_uss_mb"] > 0
        assert run["peak_processes"] >= 2 and run["memory_samples"] >= 1
        assert set(run["at_pss_peak"]) == {"standalone"}
    compared = huge["compared_with"]
    assert compared["workload"] == "run-200" and compared["executing_tasks_per_s_ratio"] > 0
    assert "compared_with" not in small
    assert "large runs: time" in tables and "large runs: cost" in tables


def test_one_second_schedules_report_their_fire_delay(tmp_path: Path) -> None:
    figures, tables = bench(tmp_path, "--only", "schedules", "--schedules", "3", "--duration", "2")
    measured = figures["workloads"]["schedules-3"]["treadle"]
    slots = measured["slots"]
    assert slots["expected_slots"] == 6 and slots["duplicated"] == 0
    # A slot fired more than a second late is passed over by design (catchup off).
    assert measured["runs_in_window"] + slots["missed"] == 6
    fire = measured["fire_delay"]
    assert fire["count"] == measured["runs_in_window"] > 0
    assert fire["min_ms"] >= 0 and ordered(fire)
    assert measured["start_delay"]["min_ms"] >= fire["min_ms"]
    assert "1-second schedules" in tables and "schedules-3" in tables


def test_failover_times_the_takeover_after_a_sigkill(tmp_path: Path) -> None:
    figures, tables = bench(tmp_path, "--only", "failover", "--failovers", "1")
    measured = figures["workloads"]["failover"]["treadle"]
    (kill,) = measured["rounds"]
    assert kill["new_epoch"] > kill["killed_epoch"]
    assert kill["new_leader_pid"] not in (None, kill["killed_pid"])
    # The standby takes the lease only once the dead leader's has lapsed, then fires.
    assert 0 < kill["lease_taken_after_s"] <= kill["first_run_after_s"]
    assert kill["first_firing_runs"] >= 1
    assert measured["takeover_s"]["max"] == kill["first_run_after_s"]
    assert measured["slots"]["duplicated"] == 0
    assert "leader failover" in tables


def test_burst_reports_when_every_due_dag_has_its_run(tmp_path: Path) -> None:
    figures, tables = bench(tmp_path, "--only", "burst", "--burst", "20", "--burst-every", "5")
    measured = figures["workloads"]["burst-20"]["treadle"]
    assert measured["runs_created"] == measured["dags_with_a_run"] == 20
    assert measured["fire_to_queued_s"]["count"] == 20 and measured["fire_to_queued_s"]["min_s"] >= 0
    assert measured["all_have_a_run_after_s"] > 0
    assert measured["batches_committed"]["count"] >= 1
    assert "schedule burst" in tables and "20 of 20" in tables


def test_an_unknown_workload_is_refused_with_the_choices() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "bench", "--only", "everything"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "unknown workload everything: choose from chain" in done.stderr


def test_a_workload_that_fails_is_reported_with_the_figures_of_the_others(tmp_path: Path) -> None:
    unreachable = "postgresql://postgres@127.0.0.1:1/test"
    figures, output = bench(tmp_path, "--database", unreachable, "--only", "chain", expect_ok=False)
    assert figures["workloads"] == {}
    assert figures["errors"]["chain-100"].startswith("OperationalError: ")
    assert '"127.0.0.1", port 1 failed' in figures["errors"]["chain-100"]
    assert "1 workload(s) failed: chain-100: " in output
