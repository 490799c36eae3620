"""REST API figures on PostgreSQL: run list paging, a 500-task run's detail, concurrent triggers, RSS.

Seeds `--runs` runs (default 100,000; rows inserted in batches, as the engine builds them) and
one run of 500 tasks, starts `treadle api` as a real process, and measures over HTTP:

* run list: `--pages` consecutive pages of 50 following `next_cursor` from the newest;
* run detail of the 500-task run, `--details` times;
* triggers under `--clients` concurrent clients, two ways:
  - `trigger` (paced): each client triggers `--triggers` runs, one every `1 / --rate` seconds
    (first at a random phase), so the API answers 50 connected clients at a steady load;
  - `trigger_saturated` (closed loop): each client triggers again as soon as answered, which
    measures throughput (`per_s`): its latency is the queue of 50 waiting requests;
  each client sends an `Idempotency-Key` on every other trigger, as a retrying client would;
  the clients are threads spread over `--client-processes` processes (5), and the figures say
  how much CPU they spent per trigger (`trigger_client_cpu_ms`) next to the API's;
* the API process's resident memory (VmRSS) after all of it.

`--scenarios trigger` (or any comma-separated subset of list, detail, trigger, saturated) runs
only those; with `--runs 1000` the seeding takes a second.

`--profile FILE` samples the API process with py-spy during the triggers (collapsed stacks).
Prints one JSON object with p50 / p99 / max per operation, and the machine's load averages.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from _common import emit, machine, percentile, pg_database

from treadle import dag, task
from treadle.domain.access import ALL_TEAMS, Role
from treadle.domain.dag_version import DagVersion
from treadle.domain.states import RunType
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.engine.dags import sync_dags
from treadle.engine.runs import new_run
from treadle.store import migrate
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

PASSWORD = "benchmark admin password"


@task
def noop() -> None:
    return None


@dag(dag_id="bench_api_small")
def small() -> None:
    noop()


@dag(dag_id="bench_api_wide")
def wide() -> None:
    for _ in range(500):
        noop()


def seed(db: Database, runs: int) -> str:
    """Insert `runs` one-task runs (created a second apart) and one 500-task run; its id."""
    versions = sync_dags(
        db, structures=[small.structure(), wide.structure()], scanned_files=[], errors={}
    ).versions
    small_v = DagVersion.of(versions["bench_api_small"], small.structure())
    wide_v = DagVersion.of(versions["bench_api_wide"], wide.structure())
    now = db.query(db_now)
    done = 0
    while done < runs:
        batch = min(2000, runs - done)
        made = [_run(small_v, now - timedelta(seconds=done + i)) for i in range(batch)]
        with db.begin() as conn:
            run_store.insert_runs(conn, [r for r, _ in made])
            ti_store.insert_task_instances(conn, [row for _, rows in made for row in rows])
        done += batch
    big, rows = _run(wide_v, now + timedelta(seconds=1))
    with db.begin() as conn:
        run_store.insert_runs(conn, [big])
        ti_store.insert_task_instances(conn, rows)
    with db.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    return big.run_id


def _run(version: DagVersion, at: Any) -> Any:  # Any: (RunInfo, rows) as new_run builds them
    return new_run(
        version,
        run_type=RunType.MANUAL,
        logical_date=at,
        data_interval=(at, at),
        conf={},
        params={},
        triggered_by="bench",
        now=at,
        default_queue_timeout_s=600,
    )


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def dist(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50) * 1000, 2),
        "p99_ms": round(percentile(values, 99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


SCENARIOS = ("list", "detail", "trigger", "saturated")


def measure(base: str, token: str, big_run: str, args: argparse.Namespace, *, pid: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    client = httpx.Client(base_url=base, headers=headers, timeout=60)
    figures: dict[str, Any] = {}
    if "list" in args.scenarios:
        pages: list[float] = []
        cursor = None
        for _ in range(args.pages):
            params = {"limit": 50, **({"cursor": cursor} if cursor else {})}
            start = time.perf_counter()
            body = client.get("/api/v1/runs", params=params).json()
            pages.append(time.perf_counter() - start)
            cursor = body["next_cursor"]
        figures["run_list_page"] = dist(pages)
    if "detail" in args.scenarios:
        details = [
            timed(lambda: client.get(f"/api/v1/runs/{big_run}").raise_for_status())
            for _ in range(args.details)
        ]
        figures["run_detail_500_tasks"] = dist(details)
    triggers = 0
    cpu_before = cpu_s(pid)
    if "trigger" in args.scenarios:
        paced = _triggers(base, headers, args, rate=args.rate)
        triggers += len(paced)
        figures["trigger"] = {"clients": args.clients, "per_client_per_s": args.rate, **dist(paced)}
    if "saturated" in args.scenarios:
        began = time.perf_counter()
        saturated = _triggers(base, headers, args, rate=None)
        took = time.perf_counter() - began
        triggers += len(saturated)
        figures["trigger_saturated"] = {
            "clients": args.clients,
            "per_s": round(len(saturated) / took, 1),
            **dist(saturated),
        }
    if triggers:
        #: CPU the API process spent per trigger (user + system), whatever the machine's load.
        figures["trigger_api_cpu_ms"] = round((cpu_s(pid) - cpu_before) * 1000 / triggers, 2)
        #: And what the clients spent sending them (on the same machine's cores).
        figures["trigger_client_cpu_ms"] = round(sum(_CLIENT_CPU) * 1000 / triggers, 2)
        figures["client_processes"] = max(1, min(args.client_processes, args.clients))
    return figures


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _triggers(
    base: str, headers: dict[str, str], args: argparse.Namespace, *, rate: float | None
) -> list[float]:
    """Latencies of `--clients` clients each triggering `--triggers` runs (paced at `rate` per
    second per client, or back to back when None), as threads spread over
    `--client-processes` processes: one Python process sending for 50 threads spent more CPU
    per request than the API answering it, and its threads' wait for the interpreter lock was
    counted as the API's latency. `_CLIENT_CPU` gets the clients' CPU seconds (all processes)."""
    processes = max(1, min(args.client_processes, args.clients))
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    out = context.SimpleQueue()
    shares = [
        args.clients // processes + (1 if i < args.clients % processes else 0) for i in range(processes)
    ]
    procs = [
        context.Process(target=_client_process, args=(base, headers, args, rate, n, barrier, out))
        for n in shares
    ]
    for p in procs:
        p.start()
    latencies: list[float] = []
    cpu = 0.0
    for _ in procs:
        got, used = out.get()
        latencies.extend(got)
        cpu += used
    for p in procs:
        p.join(timeout=60)
    _CLIENT_CPU.append(cpu)
    return latencies


#: CPU seconds the client processes of each `_triggers` call spent sending.
_CLIENT_CPU: list[float] = []


def _client_process(
    base: str,
    headers: dict[str, str],
    args: argparse.Namespace,
    rate: float | None,
    clients: int,
    barrier: Any,  # multiprocessing.Barrier
    out: Any,  # multiprocessing.SimpleQueue
) -> None:
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client() -> None:
        own = httpx.Client(base_url=base, headers=headers, timeout=60)
        start.wait()
        next_at = time.perf_counter() + (random.random() / rate if rate else 0.0)
        for n in range(args.triggers):
            if rate:
                time.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += 1 / rate
            key = {"Idempotency-Key": uuid.uuid4().hex} if n % 2 else {}
            took = timed(
                lambda key=key: own.post(
                    "/api/v1/dags/bench_api_small/runs", json={}, headers=key
                ).raise_for_status()
            )
            with lock:
                latencies.append(took)
        own.close()

    random.seed()  # each process its own phases
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()  # every process's clients are connected
    began = time.process_time()
    start.wait()
    for t in threads:
        t.join()
    out.put((latencies, time.process_time() - began))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--details", type=int, default=50)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--triggers", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1.0, help="Paced triggers per second per client.")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=5,
        help="Processes the trigger clients are spread over (threads in each).",
    )
    parser.add_argument("--profile", type=Path, default=None, help="Write py-spy collapsed stacks here.")
    parser.add_argument("--api-log", type=Path, default=None, help="Write the API process's stderr here.")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"Comma-separated, of {', '.join(SCENARIOS)} (default: all); `--scenarios trigger` "
        "measures the paced triggers alone.",
    )
    args = parser.parse_args()
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown or not chosen:
        parser.error(
            f"--scenarios: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SCENARIOS)}"
        )
    args.scenarios = frozenset(chosen)
    with pg_database("bench_api") as url, tempfile.TemporaryDirectory() as home:
        db = Database(url, pool_size=4)
        migrate.upgrade(db)
        seeded = time.perf_counter()
        big_run = seed(db, args.runs)
        seed_s = time.perf_counter() - seeded
        accounts.create_user(db, "bench", PASSWORD, team=ALL_TEAMS, role=Role.ADMIN, by=Caller(actor="bench"))
        token, _ = accounts.create_token(
            db,
            "bench",
            name="bench",
            team=ALL_TEAMS,
            role=Role.OPERATOR,
            expires_in=None,
            by=Caller(actor="bench"),
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            **os.environ,
            "TREADLE_DATABASE_URL": url,
            "TREADLE_HOME": home,
            "TREADLE_SECRET_KEY": "b" * 48,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "treadle.cli", "api", "--port", str(port), "--log-level", "WARNING"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=args.api_log.open("wb") if args.api_log else subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            spy = _profiler(proc.pid, args.profile) if args.profile else None
            figures = measure(base, token, big_run, args, pid=proc.pid)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            figures["api_rss_mb"] = rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            db.dispose()
    emit(
        {
            "benchmark": "api",
            "machine": machine(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "runs": args.runs,
            "seed_s": round(seed_s, 1),
            **figures,
        }
    )


def _profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` (every thread, idle ones left out) until sent SIGINT."""
    spy = Path(sys.executable).with_name("py-spy")
    command = [
        str(spy),
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--output",
        str(out),
        "--rate",
        os.environ.get("TREADLE_BENCH_PROFILE_RATE", "200"),
    ]
    return subprocess.Popen([*command, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
