"""`LocalProcessJob`: a command run as a detached local process, submitted once and polled.

The command runs under a small wrapper (`_wrapper.py`) started in a session of its own, so it
outlives the task process, the worker and a worker restart; the wrapper writes the command's
pid and, when it ends, its exit code to files in the job's folder. The handle names the
wrapper's pid (also the job's process group) with its start time (so a recycled pid is never
taken for the job) and the folder. A poll reads the exit file, or checks that the wrapper still
runs; a wrapper gone without an exit file is an unknown commit. A cancel sends SIGTERM to the
process group, then SIGKILL after `cancel_grace`.

The job lives on one host: poll it from workers of that host (a queue per host).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from treadle.authoring.context import TaskContext
from treadle.authoring.outcomes import Retryable
from treadle.authoring.sensing import Deferred, PollResult

WRAPPER = Path(__file__).with_name("_wrapper.py")
#: Last characters of the command's stderr kept in a failure's message.
STDERR_TAIL_CHARS = 2_000


def default_base_dir() -> Path:
    """Where job folders go: $TREADLE_HOME/jobs, else treadle-jobs in the temporary folder."""
    home = os.environ.get("TREADLE_HOME")
    return Path(home) / "jobs" if home else Path(tempfile.gettempdir()) / f"treadle-jobs-{os.getuid()}"


def process_start_ticks(pid: int) -> int | None:
    """The start time of a live (not zombie) process in clock ticks since boot; None if none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class LocalProcessJob(Deferred):
    """Run `argv` as a detached local process; succeed with exit code 0, and classify any other
    by the task's exit-code contract (`exit_codes=`)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        base_dir: str | None = None,
        cancel_grace: float | timedelta = 10.0,
        **settings: Any,
    ) -> None:
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"argv must be a non-empty list of strings (no shell), got {argv!r}")
        self.argv = list(argv)
        self.cwd, self.env = cwd, dict(env) if env is not None else None
        self.base_dir = base_dir
        grace = cancel_grace.total_seconds() if isinstance(cancel_grace, timedelta) else float(cancel_grace)
        self.cancel_grace_s = grace
        super().__init__(**settings)

    def submit(self, context: TaskContext) -> dict[str, Any]:
        base = Path(self.base_dir) if self.base_dir else default_base_dir()
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder = tempfile.mkdtemp(prefix=f"{context.dag_id}.{context.task_id}.", dir=base)
        env = {**os.environ, **(self.env or {})}
        if context.manifest_path:
            # The manifest file goes with the attempt: the job gets its own copy.
            copy = Path(folder) / "manifest.json"
            copy.write_text(json.dumps(context.manifest, indent=2, sort_keys=True))
            env["TREADLE_MANIFEST_FILE"] = str(copy)
        wrapper = subprocess.Popen(
            [sys.executable, str(WRAPPER), folder, "--", *self.argv],
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        _SPAWNED[wrapper.pid] = wrapper
        return {
            "host": socket.gethostname(),
            "pid": wrapper.pid,
            "start_ticks": process_start_ticks(wrapper.pid),
            "dir": folder,
        }

    def poll(self, handle: Any, context: TaskContext) -> PollResult:
        self._same_host(handle)
        folder = Path(handle["dir"])
        ended = _read_exit(folder)
        if ended is None and self._alive(handle):
            return PollResult.running(pid=_job_pid(folder))
        ended = ended if ended is not None else _read_exit(folder)  # it may have ended just now
        _reap(handle)
        if ended is None:
            return PollResult.unknown_commit(
                f"the job's wrapper (pid {handle['pid']}) is gone without recording how the job ended"
            )
        code = int(ended.get("exit_code", 1))
        evidence = {"exit_code": code, "dir": str(folder)}
        if code == 0:
            return PollResult.success({"exit_code": 0, "dir": str(folder)}, **evidence)
        tail = _tail(folder / "stderr")
        message = ended.get("error") or (f"stderr: {tail}" if tail else "")
        return PollResult.failed(code, message, dir=str(folder))

    def cancel(self, handle: Any) -> None:
        self._same_host(handle)
        folder = Path(handle["dir"])
        if _read_exit(folder) is not None:
            _reap(handle)
            return
        pid = int(handle["pid"])
        if self._alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cancel_grace_s
        while time.monotonic() < deadline and self._alive(handle) and _read_exit(folder) is None:
            time.sleep(0.05)
        job = _job_pid(folder)
        if self._alive(handle) or (job is not None and process_start_ticks(job) is not None):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            if job is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(job, signal.SIGKILL)
        _reap(handle)

    @staticmethod
    def _alive(handle: Mapping[str, Any]) -> bool:
        ticks = process_start_ticks(int(handle["pid"]))
        return ticks is not None and (handle.get("start_ticks") is None or ticks == handle["start_ticks"])

    @staticmethod
    def _same_host(handle: Mapping[str, Any]) -> None:
        host = socket.gethostname()
        if handle.get("host") not in (None, host):
            raise Retryable(f"the job runs on {handle['host']}, not on this host ({host})")


#: Wrappers started by this process (kept so that an ended one is reaped, never left a zombie).
_SPAWNED: dict[int, subprocess.Popen[bytes]] = {}


def _reap(handle: Mapping[str, Any]) -> None:
    pid = int(handle["pid"])
    wrapper = _SPAWNED.pop(pid, None)
    if wrapper is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            wrapper.wait(timeout=1)
        return
    with contextlib.suppress(ChildProcessError):  # a wrapper re-parented to this process
        os.waitpid(pid, os.WNOHANG)


def _read_exit(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / "exit").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"exit_code": 1, "error": f"unreadable exit file: {exc}"}
    return data if isinstance(data, dict) else {"exit_code": 1, "error": "malformed exit file"}


def _job_pid(folder: Path) -> int | None:
    try:
        return int((folder / "pid").read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as src:
            src.seek(0, os.SEEK_END)
            size = src.tell()
            src.seek(max(size - STDERR_TAIL_CHARS, 0))
            return src.read().decode(errors="replace").strip()
    except OSError:
        return ""
