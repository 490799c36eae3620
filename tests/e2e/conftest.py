"""A small harness for end-to-end tests: real treadle processes on one database.

`cluster(database_url, **env)` gives a `Cluster` with its own DAG folder, home and logs. Every
process it starts is stopped at teardown (resumed first if a test left it stopped), and the
pids that test tasks record under `cluster.pids` are killed if they are still alive. When a test
fails, the tail of every process log is attached to its report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import run_cli, start, stop, treadle_env
from tests.helpers.wait import wait_for
from treadle.domain.states import TERMINAL_RUN_STATES
from treadle.engine import queries
from treadle.engine.queries import RunDetail
from treadle.store.database import Database

_CLUSTERS = pytest.StashKey[list["Cluster"]]()

#: Short leases so a dead worker is noticed in seconds (lease >= 3 x heartbeat).
SHORT_LEASE = {"TREADLE_LEASE_SECONDS": "3", "TREADLE_HEARTBEAT_SECONDS": "1"}


def process_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (an unreaped corpse counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class Cluster:
    """Processes, DAG folder and database of one end-to-end test."""

    def __init__(self, root: Path, database_url: str, extra_env: dict[str, str]) -> None:
        self.root = root
        self.database_url = database_url
        self.dags = root / "dags"
        self.dags.mkdir(parents=True)
        #: Test tasks write their pid (and their children's) here, one file each.
        self.pids = root / "pids"
        self.pids.mkdir()
        self.home = root / "home"
        self.env = treadle_env(database_url=database_url, dags_folder=self.dags, home=self.home, **extra_env)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._db: Database | None = None

    # -- files ---------------------------------------------------------------------------
    def write_dag(self, name: str, source: str, **substitutions: object) -> Path:
        """Write a DAG file; `__KEY__` markers in `source` are replaced by repr(value)."""
        text = textwrap.dedent(source)
        for key, value in substitutions.items():
            text = text.replace(f"__{key.upper()}__", repr(value))
        path = self.dags / name
        path.write_text(text)
        return path

    def log(self, name: str) -> str:
        """Everything a process wrote so far."""
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- processes -----------------------------------------------------------------------
    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `treadle ARGS...` as process `name` (logs to ROOT/NAME.log); `env` overrides."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is running"
        proc = start(list(args), {**self.env, **(env or {})}, self.root / f"{name}.log")
        self.procs[name] = proc
        return proc

    def worker(self, name: str, concurrency: int = 1) -> subprocess.Popen[bytes]:
        """Start a `treadle worker`."""
        return self.start(name, "worker", "--concurrency", str(concurrency))

    def wait_started(self, name: str, *, after: int = 0, timeout: float = 90) -> None:
        """Wait until worker `name` logged its start (`after`: the starts it had logged before)."""
        wait_for(
            lambda: self.log(name).count('"worker.started"') > after,
            timeout=timeout,
            message=f"{name} to start",
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a short CLI command."""
        return run_cli(list(args), self.env)

    def cli_json(self, *args: str) -> Any:
        """Run a CLI command with --json; it must succeed and print JSON."""
        done = self.cli(*args, "--json")
        assert done.returncode == 0, f"treadle {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return json.loads(done.stdout)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run through the CLI; returns its id."""
        run = self.cli_json("dags", "trigger", dag_id, "--conf", json.dumps(conf or {}))
        run_id: str = run["run_id"]
        return run_id

    def signal(self, name: str, sig: int) -> None:
        """Send a signal to the process group of `name`."""
        os.killpg(self.procs[name].pid, sig)

    def stop_all(self) -> None:
        """Resume and stop every process, then kill leftovers that test tasks recorded."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            stop(proc)
        for pid in self.recorded_pids():
            if process_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._db is not None:
            self._db.dispose()

    def recorded_pids(self) -> list[int]:
        """Pids written by test tasks into `self.pids`."""
        return [int(pid) for p in sorted(self.pids.iterdir()) for pid in p.read_text().split()]

    # -- database ------------------------------------------------------------------------
    @property
    def db(self) -> Database:
        """The database, for inspecting state (read-only use by the tests)."""
        if self._db is None:
            self._db = Database(self.database_url, application_name="treadle-e2e-test")
        return self._db

    def detail(self, run_id: str) -> RunDetail:
        """Everything recorded about a run."""
        return queries.run_detail(self.db, run_id)

    def wait_dag(self, dag_id: str, *, timeout: float = 30.0) -> None:
        """Wait until a process has registered `dag_id` from the DAG folder."""
        wait_for(
            lambda: queries.get_dag(self.db, dag_id) is not None,
            timeout=timeout,
            interval=0.1,
            message=f"DAG {dag_id} to be registered",
        )

    def wait_run(self, run_id: str, *, timeout: float = 60.0) -> RunDetail:
        """Wait until the run is terminal and return its detail."""

        def done() -> RunDetail | None:
            detail = self.detail(run_id)
            return detail if detail.run.state in TERMINAL_RUN_STATES else None

        return wait_for(done, timeout=timeout, interval=0.2, message=f"run {run_id} to finish")

    def logs_tail(self, lines: int = 60) -> str:
        """The last lines of every process log."""
        parts = []
        for name in self.procs:
            tail = self.log(name).splitlines()[-lines:]
            parts.append(f"--- {name} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(parts)


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Factory: `cluster(database_url, **extra_env)` -> Cluster, all stopped at teardown."""
    made: list[Cluster] = []
    request.node.stash[_CLUSTERS] = made

    def make(database_url: str, **extra_env: str) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", database_url, extra_env)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach process logs to the report of a failed end-to-end test."""
    outcome = yield
    report = outcome.get_result()
    clusters = item.stash.get(_CLUSTERS, [])
    if report.when == "call" and report.failed and clusters:
        report.sections.append(("treadle process logs", "\n".join(c.logs_tail() for c in clusters)))
