"""`treadle bench`: end-to-end workloads on real treadle processes, optionally against Celery.

treadle side: a fresh database (a new database on the PostgreSQL server given, or a new SQLite
file), `--workers` worker processes with `--slots` slots each and one scheduler (SQLite: one
`treadle standalone` process with `--slots` slots). Each measurement triggers a run from this
process (in-process `trigger_run`, so on SQLite it is a trigger from another process than the
one running it) and polls the run's state every 2 ms until it is `success`; the wall time from
the trigger call to seeing success is the figure. Celery side (`--vs-celery`): `--workers`
`celery worker` processes (prefork, `--slots` children each) on Redis, the same shapes as
canvases, the wall time from `apply_async` to the result. Repetitions alternate between the
two systems, so load on the machine falls on both alike.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from treadle.bench.harness import (
    Processes,
    check_alive,
    cli,
    cpu_seconds,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    stop_groups,
    treadle_env,
    wait_for,
)
from treadle.bench.workloads import CELERY_APP, Workload, workloads
from treadle.domain.urls import parse_database_url, sqlite_file

#: Seconds between two reads of the run's state while waiting for it to end.
POLL_S = 0.002


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    """What `treadle bench` measures and how."""

    #: A PostgreSQL URL (a fresh database is created on that server) or "sqlite".
    database: str = "sqlite"
    slots: int = 2
    workers: int = 1
    reps: int = 3
    only: tuple[str, ...] = ()
    vs_celery: bool = False
    redis: str = "redis://127.0.0.1:6379/13"
    timeout_s: float = 300.0
    chain: int = 100
    width: int = 500
    independent: int = 2000
    big: int = 10_000
    progress: Callable[[str], None] = field(default=lambda _: None)


def selected(options: BenchOptions) -> list[Workload]:
    """The workloads `options.only` names (all when empty); ValueError naming an unknown one."""
    every = workloads(
        chain=options.chain, width=options.width, independent=options.independent, big=options.big
    )
    if not options.only:
        return every
    by_prefix = {w.name.split("-")[0]: w for w in every} | {w.name: w for w in every}
    unknown = [n for n in options.only if n not in by_prefix]
    if unknown:
        names = ", ".join(w.name.split("-")[0] for w in every)
        raise ValueError(f"unknown workload {', '.join(unknown)}: choose from {names}")
    return [w for w in every if w in {by_prefix[n] for n in options.only}]


# -- treadle -------------------------------------------------------------------------------------


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
        self.env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        self.procs = Processes()
        self.logs: list[Path] = []
        self.scheduler_pid: int | None = None

    def start(self) -> None:
        """Migrate, register the DAGs, start the processes and wait until the workers claim."""
        cli(["db", "upgrade"], self.env)
        cli(["dags", "sync"], self.env)
        slots = str(self.options.slots)
        if self.sqlite_path is not None:
            log = self.root / "standalone.log"
            self.logs = [log]
            self.scheduler_pid = self.procs.start(["standalone", "--concurrency", slots], self.env, log).pid
        else:
            for i in range(self.options.workers):
                log = self.root / f"worker{i}.log"
                self.logs.append(log)
                self.procs.start(["worker", "--concurrency", slots], self.env, log)
            log = self.root / "scheduler.log"
            self.logs.append(log)
            self.scheduler_pid = self.procs.start(["scheduler"], self.env, log).pid
        for log in self.logs[: max(len(self.logs) - 1, 1)]:
            wait_for("treadle to start", partial(log_mentions, log, '"worker.started"'), timeout=120)

    def once(self, workload: Workload) -> dict[str, Any]:
        """Trigger one run and wait for it: wall seconds from the trigger to seeing success."""
        from treadle.engine.runs import trigger_run
        from treadle.store.database import Database

        db = Database(self.url, application_name="treadle-bench")
        try:
            with self._state_reader() as state:
                began = time.perf_counter()
                run_id = trigger_run(db, workload.dag_id, triggered_by="treadle-bench").run_id
                deadline = time.monotonic() + self.options.timeout_s
                polls = 0
                while (current := state(run_id)) not in ("success", "failed"):
                    polls += 1
                    if polls % 500 == 0:
                        check_alive(self.procs, self.logs)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"run {run_id} not done in {self.options.timeout_s} s")
                    time.sleep(POLL_S)
                wall = time.perf_counter() - began
        finally:
            db.dispose()
        if current != "success":
            raise RuntimeError(f"treadle run {run_id} of {workload.dag_id} ended {current}")
        self._check_value(workload, run_id)
        return {"wall_s": wall, "run_id": run_id}

    def big(self, workload: Workload) -> dict[str, Any]:
        """One large run: wall time, tasks/s, scheduler CPU and the peak memory of all processes."""
        pids = [p.pid for p in self.procs.procs]
        cpu_before = cpu_seconds([self.scheduler_pid]) if self.scheduler_pid else 0.0
        sampler = MemorySampler(pids)
        sampler.start()
        try:
            result = self.once(workload)
        finally:
            sampler.stop()
        cpu = (cpu_seconds([self.scheduler_pid]) if self.scheduler_pid else 0.0) - cpu_before
        wall = result["wall_s"]
        return {
            "wall_s": round(wall, 3),
            "tasks_per_s": round(workload.tasks / wall, 1),
            "scheduler_cpu_s": round(cpu, 3),
            "peak_pss_mb": round(sampler.peak_pss_kb / 1024, 1),
            "peak_processes": sampler.peak_processes,
        }

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
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as pg:

        def read(sql: str, arg: str) -> Any:
            return [row[0] for row in pg.execute(sql.replace("?", "%s"), (arg,)).fetchall()]

        yield read


class MemorySampler(threading.Thread):
    """Samples the summed PSS of some processes and all their descendants, keeping the peak."""

    def __init__(self, roots: list[int], every_s: float = 0.25) -> None:
        super().__init__(name="treadle-bench-memory", daemon=True)
        self.roots, self.every_s = roots, every_s
        self.peak_pss_kb = 0
        self.peak_processes = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while True:
            pids = descendants(self.roots)
            total = sum(pss_kb(pid) for pid in pids)
            if total > self.peak_pss_kb:
                self.peak_pss_kb, self.peak_processes = total, len(pids)
            if self._halt.wait(self.every_s):
                return

    def stop(self) -> None:
        """Take one last sample and end."""
        self._halt.set()
        self.join(timeout=5)


def descendants(roots: list[int]) -> list[int]:
    """The live processes among `roots` and all their descendants (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if Path(f"/proc/{pid}").exists() and pid not in found:
            found.append(pid)
            todo.extend(parents.get(pid, []))
    return found


def pss_kb(pid: int) -> int:
    """Proportional set size of a process in kB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


# -- Celery --------------------------------------------------------------------------------------


class CelerySide:
    """`celery worker` processes on Redis running the same shapes as canvases."""

    def __init__(self, root: Path, options: BenchOptions) -> None:
        self.root, self.options = root, options
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [root / f"celery{i}.log" for i in range(options.workers)]
        self.tasks: Any = None
        self.client: Any = None

    def start(self) -> None:
        """Check Redis is empty, start the workers and wait until each is ready."""
        try:
            import redis
        except ImportError as exc:
            raise RuntimeError("--vs-celery needs Celery and Redis: pip install 'treadle[bench]'") from exc
        self.client = redis.Redis.from_url(self.options.redis)
        if self.client.dbsize() != 0:
            raise RuntimeError(f"{self.options.redis} is not empty; name an unused database with --redis")
        (self.root / "treadle_bench_celery.py").write_text(CELERY_APP)
        queue = f"treadle_bench_{os.getpid()}"
        os.environ.update(BENCH_REDIS=self.options.redis, BENCH_QUEUE=queue)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        sys.path.insert(0, str(self.root))
        self.tasks = importlib.import_module("treadle_bench_celery")
        for i, log in enumerate(self.logs):
            argv = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "treadle_bench_celery",
                "worker",
                "--pool",
                "prefork",
            ]
            argv += ["--concurrency", str(self.options.slots), "--hostname", f"bench{i}@%h"]
            argv += ["--loglevel", "INFO", "--logfile", str(log)]
            argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
            with (self.root / f"celery{i}.out").open("ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=self.root,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for log in self.logs:
            wait_for("a Celery worker to be ready", partial(log_mentions, log, " ready."), timeout=120)

    def once(self, workload: Workload) -> dict[str, Any]:
        """Submit the workload's canvas and wait for its result."""
        assert workload.celery is not None
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a Celery worker exited with {proc.returncode}")
        canvas = workload.celery(self.tasks)
        began = time.perf_counter()
        value = canvas.apply_async().get(timeout=self.options.timeout_s, interval=0.005)
        wall = time.perf_counter() - began
        if workload.expected is not None and int(value) != workload.expected:
            raise RuntimeError(f"Celery {workload.name} returned {value!r}, expected {workload.expected}")
        return {"wall_s": wall}

    def stop(self) -> None:
        """Stop the workers and empty the Redis database again."""
        stop_groups(self.procs, grace_s=15)
        if self.tasks is not None:
            self.tasks.app.close()
        if self.client is not None:
            self.client.flushdb()
            self.client.close()

    def version(self) -> str:
        """Celery's version."""
        import celery

        return str(celery.__version__)


# -- the whole bench -----------------------------------------------------------------------------


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Measure the selected workloads (interleaved with Celery when asked); returns the figures."""
    chosen = selected(options)
    repeated = [w for w in chosen if not w.once]
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="treadle-bench-")))
        url = _database(stack, options, root)
        treadle = TreadleSide(root, url, options, chosen)
        stack.callback(treadle.stop)
        celery = CelerySide(root, options) if options.vs_celery else None
        if celery is not None:
            stack.callback(celery.stop)
        try:
            options.progress("starting treadle")
            treadle.start()
            if celery is not None:
                options.progress("starting Celery")
                celery.start()
            figures = _measure(treadle, celery, repeated, options)
            for w in chosen:
                if w.once:
                    options.progress(f"{w.name}: treadle")
                    figures[w.name] = {
                        "treadle": treadle.big(w),
                        "tasks": w.tasks,
                        "description": w.description,
                    }
        except BaseException:
            print_log_tails(treadle.logs + (celery.logs if celery else []))
            raise
    return {
        "benchmark": "treadle bench",
        "settings": {
            "database": "sqlite" if treadle.sqlite_path else "postgresql",
            "workers": 1 if treadle.sqlite_path else options.workers,
            "slots_per_worker": options.slots,
            "reps": options.reps,
            "celery": celery.version() if celery else None,
        },
        "machine": machine() | {"load_average": list(os.getloadavg())},
        "workloads": figures,
    }


def _database(stack: ExitStack, options: BenchOptions, root: Path) -> str:
    if options.database == "sqlite":
        return f"sqlite:///{root / 'bench.db'}"
    scheme = parse_database_url(options.database).scheme
    if not scheme.startswith("postgresql"):
        raise ValueError(f"treadle bench measures PostgreSQL or SQLite, not {scheme}")
    return stack.enter_context(pg_database("treadle_bench", options.database))


def _measure(
    treadle: TreadleSide, celery: CelerySide | None, chosen: list[Workload], options: BenchOptions
) -> dict[str, Any]:
    walls: dict[str, dict[str, list[float]]] = {w.name: {"treadle": [], "celery": []} for w in chosen}
    for w in chosen:  # one warm-up each (imports, caches, connections)
        treadle.once(w)
        if celery is not None and w.celery is not None:
            celery.once(w)
    for rep in range(options.reps):
        for w in chosen:
            options.progress(f"{w.name}: repetition {rep + 1} of {options.reps}")
            walls[w.name]["treadle"].append(treadle.once(w)["wall_s"])
            if celery is not None and w.celery is not None:
                walls[w.name]["celery"].append(celery.once(w)["wall_s"])
    figures: dict[str, Any] = {}
    for w in chosen:
        t = walls[w.name]["treadle"]
        entry: dict[str, Any] = {
            "tasks": w.tasks,
            "description": w.description,
            "treadle": _stats(t, w.tasks),
        }
        c = walls[w.name]["celery"]
        if c:
            entry["celery"] = _stats(c, w.tasks)
            entry["treadle_over_celery"] = round(statistics.median(t) / statistics.median(c), 2)
        figures[w.name] = entry
    return figures


def _stats(walls: list[float], tasks: int) -> dict[str, Any]:
    median = statistics.median(walls)
    return {
        "median_wall_s": round(median, 4),
        "walls_s": [round(w, 4) for w in walls],
        "ms_per_task": round(median * 1000 / tasks, 3),
        "tasks_per_s": round(tasks / median, 1),
    }
