"""Task processes forked by the fork server: replaced after a kill, isolated from their siblings,
running the current code of an edited DAG file, surviving the fork server's death, and dying
with the process that started them.

These drive `ChildProcess` in this test process (it plays the worker) with real processes.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Cluster, process_alive
from tests.helpers.wait import wait_for
from treadle.authoring.loader import load_file
from treadle.errors import TreadleError
from treadle.worker import child_process, forkserver
from treadle.worker.child_process import ChildImports, ChildProcess
from treadle.worker.protocol import Message, receive, send

pytestmark = pytest.mark.e2e

STATE_DAG = """
    from __future__ import annotations

    import os
    import time

    from treadle import dag, task

    SEEN: list[int] = []
    VERSION = "__VERSION__"


    @task
    def remember() -> dict:
        SEEN.append(os.getpid())
        return {"pid": os.getpid(), "seen": len(SEEN), "version": VERSION}


    @task
    def wait_for_file(path: str) -> int:
        while not os.path.exists(path):
            time.sleep(0.01)
        return os.getpid()


    @task
    def mark_then_wait(marker: str, path: str) -> int:
        open(marker, "w").close()
        while not os.path.exists(path):
            time.sleep(0.01)
        return os.getpid()


    @task
    def crash() -> None:
        os._exit(7)


    @dag(dag_id="state", description="__DESCRIPTION__")
    def state() -> None:
        remember()
        wait_for_file("")
        mark_then_wait("", "")
        crash()
"""


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    dags = tmp_path / "dags"
    dags.mkdir()
    write_state_dag(dags, "one")
    yield dags
    child_process.shutdown()


def write_state_dag(folder: Path, version: str, description: str = "") -> Path:
    """Write the DAG file: `version` changes only code, `description` changes its structure too."""
    path = folder / "state.py"
    before = path.stat().st_mtime_ns if path.exists() else 0
    source = textwrap.dedent(STATE_DAG).replace("__VERSION__", version)
    path.write_text(source.replace("__DESCRIPTION__", description))
    os.utime(path, ns=(before + 10**9, before + 10**9))  # a new mtime even on a coarse clock
    return path


def version_hash(path: Path) -> str:
    (dag,) = load_file(path)[0]
    return dag.structure().content_hash()


def imports(folder: Path, skip: Callable[[], list[str]] = list) -> ChildImports:
    return ChildImports(folder=folder, max_result_bytes=1 << 20, file_limit_s=30.0, skip=skip)


def run(
    child: ChildProcess,
    task_id: str,
    version: str,
    *args: Any,
    dag_id: str = "state",
    timeout: float = 60,
    fileloc: str = "",
) -> Message:
    """Send one attempt; its reply (EOFError if the child died)."""
    assert child.conn is not None
    send(
        child.conn,
        {
            "kind": "run",
            "dag_id": dag_id,
            "task_id": task_id,
            "run_id": "r1",
            "attempt": 1,
            "logical_date": "2026-01-01T00:00:00+00:00",
            "version_hash": version,
            "args": list(args),
            "kwargs": {},
            "fileloc": fileloc,
        },
    )
    assert child.conn.poll(timeout), f"no reply to {task_id} within {timeout} s"
    return receive(child.conn)


@pytest.fixture
def children() -> Iterator[list[ChildProcess]]:
    started: list[ChildProcess] = []
    yield started
    for child in started:
        child.kill()


def test_a_killed_child_is_replaced_and_the_next_task_runs(
    folder: Path, tmp_path: Path, children: list[ChildProcess]
) -> None:
    v1 = version_hash(folder / "state.py")
    child = ChildProcess(imports(folder))
    children.append(child)
    first = child.process.pid
    assert os.getpgid(first) == first  # leads its own group
    replies: list[Message | Exception] = []

    def attempt() -> None:
        try:
            replies.append(run(child, "wait_for_file", v1, str(tmp_path / "never")))
        except (EOFError, OSError) as exc:
            replies.append(exc)

    runner = threading.Thread(target=attempt)
    runner.start()
    child.signal_kill()  # as a revocation does, from another thread
    runner.join(timeout=30)
    assert replies and isinstance(replies[0], EOFError | OSError)  # EOF, or reset with data unread
    assert child.exit_description() == "child process was killed by signal SIGKILL"

    child.restart()
    assert child.process.pid != first and child.process.is_alive()
    reply = run(child, "remember", v1)
    assert reply["ok"] and reply["value"]["pid"] == child.process.pid

    # A crash: the outcome says how it ended, and the next child serves.
    with pytest.raises((EOFError, OSError)):
        run(child, "crash", v1)
    assert child.exit_description() == "child process exited with code 7"
    child.restart()
    assert run(child, "remember", v1)["ok"]


def test_module_state_of_one_child_never_reaches_a_sibling(
    folder: Path, children: list[ChildProcess]
) -> None:
    v1 = version_hash(folder / "state.py")
    one, two = ChildProcess(imports(folder)), ChildProcess(imports(folder))
    children += [one, two]
    assert [run(one, "remember", v1)["value"]["seen"] for _ in range(3)] == [1, 2, 3]
    assert run(two, "remember", v1)["value"]["seen"] == 1
    one.restart()  # forked afresh: nothing of the old child's state
    assert run(one, "remember", v1)["value"]["seen"] == 1


def test_a_dag_file_edited_after_start_runs_its_new_code(folder: Path, children: list[ChildProcess]) -> None:
    v1 = version_hash(folder / "state.py")
    old = ChildProcess(imports(folder))
    children.append(old)
    assert run(old, "remember", v1)["value"]["version"] == "one"

    # Only code changed (same version hash): a child forked now runs it, as the server imported
    # the file again before forking.
    assert version_hash(write_state_dag(folder, "two")) == v1
    fresh = ChildProcess(imports(folder))
    children.append(fresh)
    assert run(fresh, "remember", v1)["value"]["version"] == "two"

    # A new version: every child runs it, also one forked from the older imports.
    v3 = version_hash(write_state_dag(folder, "three", description="changed"))
    assert v3 != v1
    assert run(old, "remember", v3)["value"]["version"] == "three"
    assert run(fresh, "remember", v3)["value"]["version"] == "three"

    # A DAG file added since: the child imports the folder again to find it.
    later = folder / "later.py"
    later.write_text(
        "from treadle import dag, task\n\n@task\ndef hi() -> str:\n    return 'hi'\n\n"
        "@dag(dag_id='later')\ndef later() -> None:\n    hi()\n"
    )
    assert run(old, "hi", version_hash(later), dag_id="later") == {
        "ok": True,
        "value": "hi",
        "exit_code": 0,
        "code_version": hashlib.sha256(later.read_bytes()).hexdigest(),  # the file it imported
    }


def test_the_skip_list_is_read_at_every_start(folder: Path, children: list[ChildProcess]) -> None:
    v1 = version_hash(folder / "state.py")
    skip: list[str] = []
    child = ChildProcess(imports(folder, lambda: list(skip)))
    children.append(child)
    assert run(child, "remember", v1)["ok"]
    skip.append(str(folder / "state.py"))
    child.restart()
    reply = run(child, "remember", v1)
    assert not reply["ok"] and "is not defined" in reply["message"]


def test_the_fork_server_dying_is_survived(
    folder: Path, tmp_path: Path, children: list[ChildProcess]
) -> None:
    v1 = version_hash(folder / "state.py")
    setup = imports(folder)
    child = ChildProcess(setup)
    children.append(child)
    shared = child_process.server_for(setup)
    assert shared is not None and shared.pid is not None
    server = shared.pid
    go = tmp_path / "go"
    assert child.conn is not None
    send(
        child.conn,
        {
            "kind": "run",
            "dag_id": "state",
            "task_id": "wait_for_file",
            "run_id": "r1",
            "attempt": 1,
            "logical_date": "2026-01-01T00:00:00+00:00",
            "version_hash": v1,
            "args": [str(go)],
            "kwargs": {},
        },
    )
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not process_alive(server), message="the fork server to die")
    # The attempt running meanwhile goes on and finishes.
    go.touch()
    assert child.conn.poll(60)
    assert receive(child.conn) == {
        "ok": True,
        "value": child.process.pid,
        "exit_code": 0,
        "code_version": hashlib.sha256((folder / "state.py").read_bytes()).hexdigest(),
    }

    # A crash is still seen (how it ended went with the server), and a new server forks the next.
    with pytest.raises((EOFError, OSError)):
        run(child, "crash", v1)
    assert child.exit_description() == (
        "child process ended; its exit status is unknown (its fork server ended first)"
    )
    child.restart()
    assert shared.pid != server and process_alive(shared.pid or 0)
    assert run(child, "remember", v1)["ok"]


def test_a_fork_server_that_cannot_start_says_why(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkserver, "_BOOT", "import sys; sys.exit(5)")
    with pytest.raises(TreadleError, match="the fork server exited with code 5"):
        ChildProcess(imports(folder))
    assert child_process.server_for(imports(folder)) is None


def test_a_fork_server_stuck_in_a_dag_file_is_replaced_by_one_that_skips_it(
    folder: Path, children: list[ChildProcess]
) -> None:
    """A file that blocks the loader's signal holds the server's import of the folder until the
    next fork request finds it stuck there: that server is killed, its successor skips the file.
    The child forked before it runs its attempt, importing only the file its DAG comes from."""
    stuck = folder / "stuck.py"
    stuck.write_text(
        "import signal\n\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\nwhile True:\n    pass\n"
    )
    setup = ChildImports(folder=folder, max_result_bytes=1 << 20, file_limit_s=0.5, skip=list)
    first = ChildProcess(setup)  # forked at once: the server imports nothing before its first forks
    children.append(first)
    shared = child_process.server_for(setup)
    assert shared is not None and shared.stuck == set()
    wait_for(lambda: shared.importing == str(stuck), timeout=30, message="the server to reach stuck.py")
    second = ChildProcess(setup)
    children.append(second)
    assert shared.stuck == {str(stuck)}
    for child in (first, second):
        assert run(child, "remember", version_hash(folder / "state.py"), fileloc=str(folder / "state.py"))[
            "ok"
        ]


WORKER_STAND_IN = """
import sys, time
from pathlib import Path
from treadle.worker import child_process
from treadle.worker.protocol import send

folder, version, marker, never = sys.argv[1:]
imports = child_process.ChildImports(
    folder=Path(folder), max_result_bytes=1 << 20, file_limit_s=30.0, skip=lambda: ()
)
child = child_process.ChildProcess(imports)
request = {"kind": "run", "dag_id": "state", "run_id": "r", "attempt": 1,
           "logical_date": "2026-01-01T00:00:00+00:00", "version_hash": version, "kwargs": {}}
send(child.conn, request | {"task_id": "mark_then_wait", "args": [marker, never]})
send(child.conn, request | {"task_id": "remember", "args": []})  # left unread
print(child.process.pid, child_process.server_for(imports).pid, flush=True)
time.sleep(300)
"""


def test_a_child_dies_with_the_process_that_started_it(folder: Path, tmp_path: Path) -> None:
    """The worker's SIGKILL ends its task processes (their parent is the fork server), also one
    busy with an attempt while another request waits unread, and the fork server."""
    v1 = version_hash(folder / "state.py")
    marker = tmp_path / "running"
    stand_in = subprocess.Popen(
        [sys.executable, "-c", WORKER_STAND_IN, str(folder), v1, str(marker), str(tmp_path / "never")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stand_in.stdout is not None
        pid, server = map(int, stand_in.stdout.readline().split())
        wait_for(marker.exists, timeout=30, message="the attempt to start")
        assert process_alive(pid) and process_alive(server)
        stand_in.kill()
        stand_in.wait(timeout=30)
        wait_for(
            lambda: not process_alive(pid) and not process_alive(server),
            timeout=30,
            message="the task process and the fork server to end",
        )
    finally:
        stand_in.kill()
        stand_in.wait(timeout=30)


CRASH_DAG = """
    from __future__ import annotations

    import os

    from treadle import dag, task


    @task
    def crash() -> None:
        os._exit(3)


    @task
    def fine() -> int:
        return os.getpid()


    @dag(dag_id="after_server_death")
    def after_server_death() -> None:
        crash()
        fine()
"""


def _fork_server(worker: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == worker and b"treadle.worker.forkserver" in cmdline:
            return int(entry.name)
    return None


def test_a_worker_whose_fork_server_was_killed_runs_its_next_tasks(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url)
    c.write_dag("after_server_death.py", CRASH_DAG)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    worker = c.worker("worker", concurrency=2)
    server = wait_for(lambda: _fork_server(worker.pid), timeout=60, message="the fork server")
    c.wait_started("worker")
    os.kill(server, signal.SIGKILL)

    detail = c.wait_run(c.trigger("after_server_death"), timeout=60)
    states = {t.task_id: t.state for t in detail.task_instances}
    assert states == {"crash": "dead_letter", "fine": "success"}
    (crashed,) = [a for a in detail.attempts if a.task_id == "crash"]
    assert crashed.error_type == "ChildProcessDied"
    # The crashed child was replaced by a new server's fork; the worker says the old one ended.
    assert c.wait_run(c.trigger("after_server_death"), timeout=60).results["fine"] > 0
    assert worker.poll() is None
    assert "worker.forkserver_died" in c.log("worker")
    assert _fork_server(worker.pid) not in (None, server)
