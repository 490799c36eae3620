"""`treadle bench`: choosing workloads, the arithmetic of its figures and the tables it prints."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from treadle.bench.burst import BurstOptions, fired_batches
from treadle.bench.figures import dist_ms, percentile, rates_by_share, ratio, second_half_over_first
from treadle.bench.memory import Footprint, Peak, parse_smaps_rollup
from treadle.bench.options import BenchOptions
from treadle.bench.report import duration, durations, sections
from treadle.bench.runner import _database, check_database, describe, selected
from treadle.bench.scheduling import holder_pid, log_events, seconds_from, slot_audit, whole_second_after

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


# -- choosing workloads ---------------------------------------------------------------------------


def names(options: BenchOptions) -> list[str]:
    return [c.name for c in selected(options)]


def test_workloads_are_chosen_by_short_or_full_name_in_bench_order() -> None:
    assert names(BenchOptions(only=("independent", "chain-100"))) == ["chain-100", "independent-2000"]
    assert names(BenchOptions(only=("burst", "schedules", "failover"))) == [
        "schedules-100",
        "failover",
        "burst-10000",
    ]


def test_the_default_set_is_the_run_workloads_and_huge_adds_the_100000_run() -> None:
    assert names(BenchOptions()) == ["chain-100", "fanout-500", "independent-2000", "run-10000"]
    assert names(BenchOptions(huge=True))[-2:] == ["run-10000", "run-100000"]
    assert names(BenchOptions(only=("chain",), huge=True)) == ["chain-100", "run-100000"]
    assert names(BenchOptions(only=("run-100000",))) == ["run-100000"]


def test_all_means_every_workload_but_the_huge_run() -> None:
    assert names(BenchOptions(everything=True)) == [
        "chain-100",
        "fanout-500",
        "independent-2000",
        "run-10000",
        "schedules-100",
        "failover",
        "burst-10000",
    ]
    assert "run-100000" in names(BenchOptions(everything=True, huge=True))


def test_sizes_name_the_workloads() -> None:
    options = BenchOptions(only=("run", "huge", "schedules", "burst"), big=300, huge_tasks=1500, schedules=5)
    assert names(options) == ["run-300", "run-1500", "schedules-5", "burst-10000"]


def test_an_unknown_workload_is_named_with_the_choices() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown workload nope: choose from chain, fanout, independent, run, huge, "
        r"schedules, failover, burst",
    ):
        selected(BenchOptions(only=("nope",)))


def test_a_large_and_a_huge_run_of_one_size_are_refused() -> None:
    with pytest.raises(ValueError, match="--big and --huge-tasks"):
        selected(BenchOptions(huge=True, big=5000, huge_tasks=5000))


def test_only_postgresql_or_sqlite_is_measured(tmp_path: Path) -> None:
    with ExitStack() as stack:
        assert _database(stack, BenchOptions(), tmp_path) == f"sqlite:///{tmp_path / 'bench.db'}"
        with pytest.raises(ValueError, match="PostgreSQL or SQLite, not mysql"):
            _database(stack, BenchOptions(database="mysql://root@127.0.0.1/test"), tmp_path)
    check_database("postgresql+psycopg://me@dbhost/postgres")
    with pytest.raises(ValueError, match="not mariadb"):
        check_database("mariadb://root@127.0.0.1/test")


def test_a_failed_workload_is_described_in_one_line() -> None:
    assert describe(TimeoutError("no run under a new leader 30 s after killing epoch 3")) == (
        "TimeoutError: no run under a new leader 30 s after killing epoch 3"
    )
    assert len(describe(RuntimeError("x" * 5000))) == 2000


# -- figures ---------------------------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_a_distribution_is_reported_in_milliseconds_with_its_count() -> None:
    figures = dist_ms([i / 1000 for i in range(1, 101)])  # 1 .. 100 ms, unordered below
    assert figures == {
        "count": 100,
        "p50_ms": 50.0,
        "p90_ms": 90.0,
        "p95_ms": 95.0,
        "p99_ms": 99.0,
        "min_ms": 1.0,
        "max_ms": 100.0,
    }
    assert dist_ms([0.2, 0.1]) == dist_ms([0.1, 0.2])
    assert dist_ms([]) == {"count": 0}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_rates_by_share_cut_the_completions_in_equal_parts() -> None:
    # 100 completions, one every 10 ms: 100 tasks/s in every tenth.
    ends = [at(0.01 * i) for i in range(1, 101)]
    assert rates_by_share(T0, ends) == [100.0] * 10
    assert second_half_over_first(T0, list(reversed(ends))) == 1.0


def test_a_run_that_slows_down_shows_in_its_later_shares() -> None:
    # First half one completion per 10 ms, second half one per 20 ms.
    ends = [at(0.01 * i) for i in range(1, 51)] + [at(0.5 + 0.02 * i) for i in range(1, 51)]
    assert rates_by_share(T0, ends, parts=2) == [100.0, 50.0]
    assert second_half_over_first(T0, ends) == 0.5


def test_rates_need_a_completion_per_share_and_survive_equal_stamps() -> None:
    assert rates_by_share(T0, [at(1)], parts=2) == []
    assert second_half_over_first(T0, [at(1)]) is None
    # SQLite stamps whole milliseconds: two shares ending on the same stamp do not divide by zero.
    assert rates_by_share(T0, [at(0.001), at(0.001)], parts=2) == [1000.0, 1000.0]
    with pytest.raises(ValueError, match="parts"):
        rates_by_share(T0, [at(1)], parts=0)


def test_ratios_are_missing_without_both_figures() -> None:
    assert ratio(3.0, 4.0) == 0.75
    assert ratio(None, 4.0) is None
    assert ratio(3.0, 0.0) is None


# -- memory ----------------------------------------------------------------------------------------

SMAPS_ROLLUP = """\
55a4c0c00000-7ffd4a3f2000 ---p 00000000 00:00 0                          [rollup]
Rss:               40960 kB
Pss:               20480 kB
Pss_Anon:          10240 kB
Shared_Clean:      16384 kB
Private_Clean:      2048 kB
Private_Dirty:     10240 kB
Swap:                  0 kB
"""


def test_rss_pss_and_uss_come_from_one_smaps_rollup() -> None:
    assert parse_smaps_rollup(SMAPS_ROLLUP) == Footprint(
        rss_kb=40960, pss_kb=20480, uss_kb=12288, processes=1
    )


def test_each_peak_is_kept_with_the_split_at_the_pss_peak() -> None:
    peak = Peak()
    peak.take({"worker0": Footprint(100, 50, 40, 3), "scheduler": Footprint(30, 20, 10, 1)})
    peak.take({"worker0": Footprint(300, 40, 30, 3), "scheduler": Footprint(30, 20, 10, 1)})
    figures = peak.figures()
    assert figures["peak_rss_mb"] == round(330 / 1024, 1)
    assert figures["peak_pss_mb"] == round(70 / 1024, 1)
    assert figures["peak_processes"] == 4 and figures["memory_samples"] == 2
    assert figures["at_pss_peak"]["worker0"]["processes"] == 3


# -- scheduler bookkeeping -------------------------------------------------------------------------


def test_slots_are_audited_for_misses_and_doubles() -> None:
    expected = seconds_from(at(0), at(3))
    assert expected == [at(0), at(1), at(2)]
    seen = [("a", at(0)), ("a", at(1)), ("a", at(1)), ("a", at(2)), ("b", at(0)), ("b", at(9))]
    audit = slot_audit(seen, ["a", "b"], expected)
    assert audit["expected_slots"] == 6
    assert audit["missed"] == 2 and audit["duplicated"] == 1
    assert audit["duplicated_examples"] == [f"a@{at(1).isoformat()} x2"]


def test_leader_pid_and_whole_seconds() -> None:
    assert holder_pid("host-1:4242:abcd1234") == 4242
    assert holder_pid("garbage") is None and holder_pid(None) is None
    assert whole_second_after(at(1.2)) == at(2) and whole_second_after(at(3)) == at(3)


def test_log_events_read_only_the_named_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    log.write_text(
        '{"ts": "2026-12-01T12:00:01+00:00", "event": "scheduler.fired", "runs": 500}\n'
        "Traceback (most recent call last): scheduler.fired\n"
        '{"ts": "2026-12-01T12:00:02+00:00", "event": "scheduler.tick", "note": "scheduler.fired"}\n'
    )
    assert [e["runs"] for e in log_events(log, "scheduler.fired")] == [500]
    assert log_events(tmp_path / "missing.log", "scheduler.fired") == []


def test_the_burst_schedule_and_the_batches_of_its_slot() -> None:
    assert BurstOptions().schedule == '"* * * * *"' and BurstOptions().period_s == 60
    assert BurstOptions(every_s=5).schedule == "timedelta(seconds=5)"
    fired = [(at(-1), 10), (at(0.4), 500), (at(1.1), 20), (at(5), 30)]
    assert fired_batches(fired, at(0), 5) == [
        {"after_slot_s": 0.4, "runs": 500},
        {"after_slot_s": 1.1, "runs": 20},
    ]


# -- tables ----------------------------------------------------------------------------------------


def result(**workloads: Any) -> dict[str, Any]:
    return {
        "settings": {"database": "postgresql", "workers": 2, "slots_per_worker": 8},
        "workloads": workloads,
    }


CHAIN = {
    "tasks": 100,
    "treadle": {
        "median_wall_s": 0.62,
        "ready_to_started": {"count": 300, "p50_ms": 2.5, "p90_ms": 4.0, "p99_ms": 12.25, "max_ms": 140.0},
    },
}
BIG: dict[str, Any] = {
    "tasks": 10_000,
    "treadle": {
        "wall_s": 17.71,
        "created_s": 1.26,
        "executing_tasks_per_s": 612.4,
        "second_half_over_first_half": 0.981,
        "scheduler_cpu_s": 0.65,
        "treadle_cpu_ms_per_task": 2.75,
        "peak_rss_mb": 420.0,
        "peak_pss_mb": 190.2,
        "peak_uss_mb": 150.0,
    },
}


def test_the_run_table_has_celery_columns_only_when_celery_ran() -> None:
    (runs, *_) = sections(result(**{"chain-100": CHAIN}))
    assert runs.title == "treadle bench: postgresql, 2 worker(s) x 8 slots"
    assert runs.columns == ("workload", "tasks", "treadle median", "per task", "tasks/s")
    assert runs.rows == [("chain-100", "100", "0.620 s", "6.2 ms", "161")]
    with_celery = {**CHAIN, "celery": {"median_wall_s": 0.5}, "treadle_over_celery": 1.24}
    (runs, *_) = sections(result(**{"chain-100": with_celery}))
    assert runs.columns[-2:] == ("Celery median", "ratio")
    assert runs.rows[0][-2:] == ("0.500 s", "1.24")


def test_latency_and_large_run_tables() -> None:
    huge = {
        "tasks": 100_000,
        "treadle": {
            **BIG["treadle"],
            "wall_s": 190.0,
            "created_s": 14.0,
            "executing_tasks_per_s": 560.0,
            "compared_with": {"workload": "run-10000", "executing_tasks_per_s_ratio": 0.914},
        },
    }
    titles = {s.title.split(" (")[0]: s for s in sections(result(**{"run-10000": BIG, "run-100000": huge}))}
    assert list(titles) == [
        "treadle bench: postgresql, 2 worker(s) x 8 slots",
        "large runs: time",
        "large runs: cost",
    ]
    assert titles["large runs: time"].rows == [
        ("run-10000", "17.7 s", "1.3 s", "612", "0.98", "-"),
        ("run-100000", "190.0 s", "14.0 s", "560", "0.98", "0.91"),
    ]
    assert titles["large runs: cost"].rows[0] == (
        "run-10000",
        "0.65 s",
        "2.8 ms",
        "420.0 MB",
        "190.2 MB",
        "150.0 MB",
    )
    unfinished = {"tasks": 100_000, "treadle": {**huge["treadle"], "finished": False, "tasks_done": 41_234}}
    time_table = [
        s for s in sections(result(**{"run-100000": unfinished})) if s.title.startswith("large runs: t")
    ]
    assert time_table[0].rows[0][1] == "unfinished after 190 s (41,234 done)"
    latency = sections(result(**{"chain-100": CHAIN}))[1]
    assert latency.columns == ("workload", "tasks", "p50", "p90", "p99", "max")
    assert latency.rows == [("chain-100", "300", "2.5 ms", "4.0 ms", "12.2 ms", "140 ms")]


def test_scheduler_tables() -> None:
    schedules = {
        "treadle": {
            "runs_in_window": 6000,
            "fire_delay": {"count": 6000, "p50_ms": 4.6, "p99_ms": 31.2, "max_ms": 88.0},
            "start_delay": {"count": 0},
            "slots": {"missed": 0, "duplicated": 0},
        }
    }
    failover = {
        "treadle": {
            "rounds": [{}, {}, {}],
            "takeover_s": {"p50": 2.61, "max": 3.2, "lease_taken_max": 3.1},
            "slots": {"missed": 0, "duplicated": 1},
        }
    }
    burst = {
        "treadle": {
            "settings": {"dags": 10_000},
            "runs_created": 10_000,
            "all_have_a_run_after_s": 1.83,
            "fire_to_queued_s": {"count": 10_000, "p50_s": 0.42, "p99_s": 1.2, "max_s": 1.3},
            "sync": {"dags_sync_wall_s": 41.0},
        }
    }
    found = sections(result(**{"schedules-100": schedules, "failover": failover, "burst-10000": burst}))
    assert [s.title for s in found] == [
        "1-second schedules",
        "leader failover (SIGKILL)",
        "schedule burst (all due at once)",
    ]
    assert found[0].rows == [("schedules-100", "6,000", "5 / 31 / 88 ms", "-", "0 / 0")]
    assert found[1].rows == [("failover", "3", "2.61 / 3.20 s", "3.10 s", "0 / 1")]
    assert found[2].rows == [("burst-10000", "10,000 of 10,000", "1.83 s", "0.42 / 1.20 / 1.30 s", "41.00 s")]


def test_durations_switch_from_milliseconds_to_seconds_at_one_second() -> None:
    singles = [duration(v) for v in (0.046, 0.9994, 1.0, 12.345, None)]
    assert singles == ["46 ms", "999 ms", "1.00 s", "12.35 s", "-"]
    assert durations([0.005, 0.031, 0.088]) == "5 / 31 / 88 ms"
    assert durations([0.42, 1.2, 1.3]) == "0.42 / 1.20 / 1.30 s"
    assert durations([0.4, None]) == "-"
