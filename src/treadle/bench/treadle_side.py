"""The treadle side of the run workloads: processes on a fresh database, one run at a time.

PostgreSQL: `--workers` `treadle worker --concurrency SLOTS` processes and one `treadle
scheduler`. SQLite: one `treadle standalone --concurrency SLOTS`. Each measurement triggers a run
from this process (in-process `trigger_run`, so on SQLite it is a trigger from another process
than the one running it) and polls the run's state until it is `success`; the wall time from
the trigger call to seeing success is the figure.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from treadle.bench.db import BenchDb, ready_to_started
from treadle.bench.figures import dist_ms, rates_by_share, second_half_over_first
from treadle.bench.harness import (
    CpuMeter,
    Processes,
    check_alive,
    cli,
    cpu_seconds,
    log_mentions,
    migrate,
    treadle_env,
    wait_for,
)
from treadle.bench.memory import MemorySampler
from treadle.bench.options import BenchOptions
from treadle.bench.workloads import Workload
from treadle.domain.urls import parse_database_url, sqlite_file
from treadle.store.tables import task_instances

#: Seconds between two reads of the run's state while waiting for a repeated run to end.
POLL_S = 0.002
#: The longest pause between two reads of a run's state, and the share of the time elapsed
#: since the trigger that a pause may take.
POLL_MAX_S, POLL_SHARE = 0.01, 0.005
#: The same for a large run measured once (its figure is seconds long; polling less perturbs less).
ONCE_POLL_S = 0.05


def large_run_limit_s(tasks: int) -> float:
    """How long a large run may take before it is reported unfinished: 300 s, or 10 ms a task
    (1,000 s for 100,000 tasks)."""
    return max(300.0, tasks * 0.01)


#: Beyond this many tasks in one DAG file, importing it may take longer than the default limit.
LARGE_DAG_TASKS = 20_000


class TreadleSide:
    """treadle processes on a fresh database, and one run at a time triggered from here."""

    def __init__(self, root: Path, url: str, options: BenchOptions, chosen: list[Workload]) -> None:
        self.root, self.url, self.options = root, url, options
        found = sqlite_file(parse_database_url(url))
        self.sqlite_path = None if found is None else str(found)
        folder = root / "dags"
        folder.mkdir()
        for w in chosen:
            (folder / f"{w.dag_id}.py").write_text(w.dag_source)
        self.tasks = sum(w.tasks for w in chosen)
        extra = {}
        if max((w.tasks for w in chosen), default=0) > LARGE_DAG_TASKS:
            extra["TREADLE_DAG_IMPORT_TIMEOUT_SECONDS"] = "900"
        self.env = treadle_env(database_url=url, dags_folder=folder, home=root / "home", **extra)
        self.procs = Processes()
        self.logs: list[Path] = []
        #: Each process by role (`standalone`, or `scheduler` and `worker0`...).
        self.roles: dict[str, int] = {}
        self.bdb: BenchDb | None = None

    def start(self) -> None:
        """Migrate, register the DAGs, start the processes and wait until the workers claim."""
        startup_s = 120 + self.tasks / 500  # a large DAG takes a while to import and register
        migrate(self.url)
        cli(["dags", "sync"], self.env, timeout=startup_s)
        slots = str(self.options.slots)
        if self.sqlite_path is not None:
            self._start("standalone", ["standalone", "--concurrency", slots])
        else:
            for i in range(self.options.workers):
                self._start(f"worker{i}", ["worker", "--concurrency", slots])
            self._start("scheduler", ["scheduler"])
        for log in self.logs[: max(len(self.logs) - 1, 1)]:
            wait_for("treadle to start", partial(log_mentions, log, '"worker.started"'), timeout=startup_s)
        self.bdb = BenchDb(self.url)

    def _start(self, role: str, args: list[str]) -> None:
        log = self.root / f"{role}.log"
        self.logs.append(log)
        self.roles[role] = self.procs.start(args, self.env, log).pid

    def once(
        self, workload: Workload, *, poll_s: float = POLL_S, give_up_after_s: float | None = None
    ) -> dict[str, Any]:
        """Trigger one run and wait for it: wall seconds from the trigger to seeing success, and
        how long the trigger call took (creating the run and its instances, committed).

        Past `give_up_after_s` (default: the bench's timeout) a run that has not ended raises
        TimeoutError, unless `give_up_after_s` was given: then it is returned unfinished
        (`finished` False), still running.
        """
        from treadle.engine.runs import trigger_run
        from treadle.store.database import Database

        timeout_s = self.options.timeout_s if give_up_after_s is None else give_up_after_s
        db = Database(self.url, application_name="treadle-bench")
        try:
            with self._state_reader() as state:
                began = time.perf_counter()
                run_id = trigger_run(db, workload.dag_id, triggered_by="treadle-bench").run_id
                triggered = time.perf_counter()
                deadline = time.monotonic() + timeout_s
                polls = 0
                while (current := state(run_id)) not in ("success", "failed"):
                    polls += 1
                    if polls % max(int(1 / poll_s), 1) == 0:
                        check_alive(self.procs, self.logs)
                    if time.monotonic() > deadline:
                        if give_up_after_s is None:
                            raise TimeoutError(f"run {run_id} not done in {timeout_s:.0f} s")
                        break
                    # Every `poll_s` at first, then at most 0.5% of the time so far (up to
                    # POLL_MAX_S): a long run's figure keeps its precision while the bench's own
                    # reads take less of the machine it measures.
                    time.sleep(max(poll_s, min(POLL_MAX_S, (time.perf_counter() - began) * POLL_SHARE)))
                wall = time.perf_counter() - began
        finally:
            db.dispose()
        finished = current in ("success", "failed")
        if finished and current != "success":
            raise RuntimeError(f"treadle run {run_id} of {workload.dag_id} ended {current}")
        if finished:
            self._check_value(workload, run_id)
        return {"wall_s": wall, "trigger_s": triggered - began, "run_id": run_id, "finished": finished}

    def big(self, workload: Workload) -> dict[str, Any]:
        """One large run: time (trigger to success, and the creation alone), tasks/s, scheduler
        CPU, CPU per task, peak memory of every process and its children, and whether the rate
        holds from the run's first tasks to its last.

        A run still going after `large_run_limit_s` is reported as it stands (`finished`
        False, with the tasks done by then) and left running: measure nothing after it.
        """
        pids = list(self.roles.values())
        scheduler = self.roles.get("scheduler", self.roles.get("standalone"))
        assert scheduler is not None and self.bdb is not None
        load0 = os.getloadavg()[0]
        cpu0 = cpu_seconds([scheduler])
        meter = CpuMeter(None if self.sqlite_path else self.url, pids)
        sampler = MemorySampler(dict(self.roles))
        sampler.start()
        try:
            result = self.once(
                workload, poll_s=ONCE_POLL_S, give_up_after_s=large_run_limit_s(workload.tasks)
            )
        finally:
            memory = sampler.stop()
        cpu = cpu_seconds([scheduler]) - cpu0
        load1 = os.getloadavg()[0]
        wall = result["wall_s"]
        run = self._timeline(result["run_id"])
        seen_done = run.pop("tasks_done", 0)
        done = workload.tasks if result["finished"] else seen_done
        return {
            "finished": result["finished"],
            **({} if result["finished"] else {"tasks_done": done, "gave_up_after_s": round(wall, 1)}),
            "wall_s": round(wall, 3),
            "tasks_per_s": round(done / wall, 1),
            "created_s": round(result["trigger_s"], 3),
            **run,
            ("standalone_cpu_s" if self.sqlite_path else "scheduler_cpu_s"): round(cpu, 3),
            **meter.figures(max(done, 1)),
            **memory,
            "load_1m_before_after": [round(load0, 2), round(load1, 2)],
        }

    def _timeline(self, run_id: str) -> dict[str, Any]:
        """From the instances' own stamps: how long the tasks ran from first start to last end,
        the rate by tenth of the completions, and ready-to-started latency."""
        assert self.bdb is not None
        ti = task_instances
        rows = self.bdb.rows(sa.select(ti.c.started_at, ti.c.ended_at).where(ti.c.run_id == run_id))
        starts = [r[0] for r in rows if r[0] is not None]
        ends = [r[1] for r in rows if r[1] is not None]
        if not starts or not ends:
            return {"tasks_done": len(ends)}
        first = min(starts)
        span = max((max(ends) - first).total_seconds(), 0.001)
        return {
            "tasks_done": len(ends),
            "executing_s": round(span, 3),
            "executing_tasks_per_s": round(len(ends) / span, 1),
            "tasks_per_s_by_tenth": rates_by_share(first, ends),
            "second_half_over_first_half": second_half_over_first(first, ends),
            "ready_to_started": dist_ms(ready_to_started(self.bdb, [run_id])),
        }

    def latency(self, run_ids: list[str]) -> dict[str, float | int]:
        """Ready-to-started distribution over the first attempts of some runs."""
        assert self.bdb is not None
        return dist_ms(ready_to_started(self.bdb, run_ids))

    def _check_value(self, workload: Workload, run_id: str) -> None:
        """The run's largest result must be the workload's expected value (the chain's end, the
        fan-out's join)."""
        if workload.expected is None:
            return
        with self._connect() as read:
            values = read("SELECT value FROM task_results WHERE run_id = ?", run_id)
        best = max((int(str(v)) for v in values if v is not None), default=None)
        if best != workload.expected:
            raise RuntimeError(f"run {run_id} returned {best!r}, expected {workload.expected}")

    @contextmanager
    def _state_reader(self) -> Iterator[Callable[[str], str]]:
        with self._connect() as read:
            yield lambda run_id: str(
                (read("SELECT state FROM dag_runs WHERE run_id = ?", run_id) or [None])[0]
            )

    def _connect(self) -> AbstractContextManager[Callable[[str, str], Any]]:
        return _reader(self.url, self.sqlite_path)

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL)."""
        self.procs.stop_all()
        if self.bdb is not None:
            self.bdb.close()


@contextmanager
def _reader(url: str, sqlite_path: str | None) -> Iterator[Callable[[str, str], Any]]:
    """A reader of one column on a plain connection (no pool, no ORM: the poll must be cheap)."""
    if sqlite_path is not None:
        conn = sqlite3.connect(sqlite_path, timeout=30)
        try:
            yield lambda sql, arg: [row[0] for row in conn.execute(sql, (arg,)).fetchall()]
        finally:
            conn.close()
        return
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as pg:

        def read(sql: str, arg: str) -> Any:
            return [row[0] for row in pg.execute(sql.replace("?", "%s"), (arg,)).fetchall()]

        yield read
