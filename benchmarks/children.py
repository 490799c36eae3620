"""What a worker's task processes cost: start-up, memory per child, and replacing one child.

A worker with `--concurrency` slots starts on a fresh PostgreSQL database with a DAG folder of
`--files` generated files, while a run of `--concurrency` tasks already waits. Reports the wall
time from starting the worker to its "worker.started" log line and to the first task it
claims, the unique memory (USS) of each task process once every slot has run a task, and the
time `ChildProcess.restart()` takes in this process on the same folder. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Processes,
    check_alive,
    cli,
    code_state,
    emit,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    summary_ms,
    treadle_env,
    wait_for,
)

FANOUT_DAG = "bench_children_fanout"
#: Targets: per-child USS, one restart, worker start to first claim.
TARGET_CHILD_USS_MB = 20
TARGET_RESTART_MS = 50
TARGET_START_TO_CLAIM_S = 2.0


def generated_dag(i: int) -> str:
    """One ordinary DAG file: a few stdlib imports, a lookup table, a DAG of five tasks."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        import decimal
        import fractions
        import json
        import statistics

        from treadle import dag, task

        RATES = {{f"k{{n}}": n * 1.5 for n in range(200)}}


        @task
        def extract() -> list[int]:
            return list(range(10))


        @task
        def transform(rows: list[int]) -> float:
            return float(statistics.mean(rows)) + float(fractions.Fraction(1, 3))


        @task
        def load(value: float) -> str:
            return json.dumps({{"v": str(decimal.Decimal(value))}})


        @task
        def audit(value: float) -> bool:
            return value >= 0


        @task
        def report(text: str, ok: bool) -> str:
            return text if ok else ""


        @dag(dag_id="gen_{i:03d}")
        def gen_{i:03d}() -> None:
            value = transform(extract())
            report(load(value), audit(value))
        """
    )


def fanout_dag(width: int) -> str:
    """`width` independent tasks that each hold their slot a moment, so every slot runs one."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        import time

        from treadle import dag, task


        @task
        def hold(n: int) -> int:
            time.sleep(1.0)
            return n


        @dag(dag_id="{FANOUT_DAG}")
        def {FANOUT_DAG}() -> None:
            for n in range({width}):
                hold(n)
        """
    )


def memory(pid: int, fields: tuple[str, ...]) -> int | None:
    """Sum of some fields of /proc/PID/smaps_rollup (kB there), in bytes; None if it ended."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in fields:
            total += int(rest.split()[0]) * 1024
    return total


def uss_bytes(pid: int) -> int | None:
    """Unique set size: Private_Clean + Private_Dirty (pages no other process maps)."""
    return memory(pid, ("Private_Clean", "Private_Dirty"))


def pss_bytes(pid: int) -> int | None:
    """Proportional set size: shared pages count divided among the processes that map them."""
    return memory(pid, ("Pss",))


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgrp, session) of a live, non-zombie process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), int(fields[3])


def descendants(root: int) -> list[int]:
    """Live descendants of `root` (children, grandchildren, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None:
            parents.setdefault(found[0], []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def task_processes(worker_pid: int) -> tuple[list[int], list[int]]:
    """(task processes, other helper processes) below a worker.

    A task process leads its own session (it calls setsid). A fork server leads one too, but
    is the worker's own child and runs `treadle.worker.forkserver` (its children share that
    command line); other helpers lead none.
    """
    tasks, helpers = [], []
    for pid in descendants(worker_pid):
        found = _stat(pid)
        if found is None:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        server = found[0] == worker_pid and b"treadle.worker.forkserver" in cmdline
        (tasks if found[2] == pid and not server else helpers).append(pid)
    return tasks, helpers


def startup_phases(log: Path, launched: float) -> dict[str, float]:
    """Seconds from launching the worker (host clock) to some of its start-up log lines."""
    wanted = {
        "dags.synced": "dags_synced",
        "worker.forkserver_started": "fork_server_ready",
        "worker.started": "worker_started",
    }
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        name = wanted.get(entry.get("event", "")) if isinstance(entry, dict) else None
        if name is not None and name not in found:
            found[name] = round(datetime.fromisoformat(entry["ts"]).timestamp() - launched, 3)
    return found


def mb(n: float) -> float:
    return round(n / 2**20, 2)


def time_restarts(folder: Path, restarts: int) -> dict[str, Any]:
    """Time ChildProcess creation and `restart()` (kill, then start again) in this process."""
    from treadle.worker.child_process import ChildImports, ChildProcess

    imports = ChildImports(folder=folder, max_result_bytes=1 << 20, file_limit_s=30.0, skip=lambda: ())
    began = time.perf_counter()
    child = ChildProcess(imports)
    first_s = time.perf_counter() - began
    second = time.perf_counter()
    sibling = ChildProcess(imports)
    second_s = time.perf_counter() - second
    durations = []
    try:
        for _ in range(restarts):
            began = time.perf_counter()
            child.restart()
            durations.append(time.perf_counter() - began)
    finally:
        child.kill()
        sibling.kill()
    return {
        "first_child_start_ms": round(first_s * 1000, 2),
        "second_child_start_ms": round(second_s * 1000, 2),
        "restart": summary_ms(durations),
        "restarts": len(durations),
    }


def started_tasks(url: str) -> tuple[int, int]:
    """(task instances started, task instances succeeded) of the fan-out run."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(started_at), count(*) FILTER (WHERE state = 'success') FROM task_instances "
            "WHERE dag_id = %s",
            (FANOUT_DAG,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=200, help="generated DAG files")
    parser.add_argument("--concurrency", type=int, default=16, help="slots of the worker")
    parser.add_argument("--restarts", type=int, default=20, help="restarts timed in-process")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for each step")
    args = parser.parse_args()

    code = code_state()
    load_before = os.getloadavg()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_children") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        for i in range(args.files):
            (folder / f"gen_{i:03d}.py").write_text(generated_dag(i))
        (folder / "fanout.py").write_text(fanout_dag(args.concurrency))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / "worker.log"]
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env, timeout=args.timeout)
            cli(["dags", "trigger", FANOUT_DAG, "--json"], env)  # its tasks wait for the worker
            began, launched = time.monotonic(), time.time()
            worker = procs.start(["worker", "--concurrency", str(args.concurrency)], env, logs[0])

            def started() -> bool:
                check_alive(procs, logs)
                return log_mentions(logs[0], '"worker.started"')

            wait_for("the worker to start", started, timeout=args.timeout, every=0.01)
            to_started_s = time.monotonic() - began
            wait_for("a first claim", lambda: started_tasks(url)[0] > 0, timeout=args.timeout, every=0.01)
            to_claim_s = time.monotonic() - began
            phases = startup_phases(logs[0], launched)
            wait_for(
                "every task of the fan-out to succeed",
                lambda: started_tasks(url)[1] == args.concurrency,
                timeout=args.timeout,
                every=0.05,
            )
            children, helpers = task_processes(worker.pid)
            child_uss = sorted(u for u in map(uss_bytes, children) if u is not None)
            child_pss = sorted(u for u in map(pss_bytes, children) if u is not None)
            helper_mem = {
                str(pid): {"uss_mb": mb(uss_bytes(pid) or 0), "pss_mb": mb(pss_bytes(pid) or 0)}
                for pid in helpers
            }
            worker_uss = uss_bytes(worker.pid)
            all_pss = sum(child_pss) + sum(pss_bytes(pid) or 0 for pid in helpers)
            restarts = time_restarts(folder, args.restarts)
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
    restart_median = restarts["restart"].get("median_ms", 1e9)
    child_median = statistics.median(child_uss) if child_uss else float("nan")
    emit(
        {
            "benchmark": "children",
            "backend": "postgresql",
            "settings": {"files": args.files, "concurrency": args.concurrency, "restarts": args.restarts},
            "machine": machine(),
            "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "code": code,
            "worker_start_to_started_wall_s": round(to_started_s, 3),
            "worker_start_to_first_claim_wall_s": round(to_claim_s, 3),
            "startup_phases_s": phases,
            "task_processes": len(children),
            "child_uss_mb": {
                "min": mb(child_uss[0]) if child_uss else None,
                "median": mb(child_median),
                "max": mb(child_uss[-1]) if child_uss else None,
                "total": mb(sum(child_uss)),
            },
            "child_pss_mb": {
                "median": mb(statistics.median(child_pss)) if child_pss else None,
                "total": mb(sum(child_pss)),
            },
            "worker_uss_mb": mb(worker_uss or 0),
            "helper_processes": helper_mem,
            "children_and_helpers_pss_total_mb": mb(all_pss),
            **restarts,
            "target": {
                "child_uss_mb_below": TARGET_CHILD_USS_MB,
                "restart_median_ms_below": TARGET_RESTART_MS,
                "start_to_first_claim_s_below": TARGET_START_TO_CLAIM_S,
            },
            "meets_target": bool(
                child_uss
                and len(children) == args.concurrency
                and max(child_uss) < TARGET_CHILD_USS_MB * 2**20
                and restart_median < TARGET_RESTART_MS
                and to_claim_s < TARGET_START_TO_CLAIM_S
            ),
        }
    )


if __name__ == "__main__":
    main()
