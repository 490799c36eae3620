"""Containment: after an attempt ends, kill whatever its task left running in the child's process group.

The task child leads its own process group (it calls setsid), and a task's subprocesses inherit
that group. The child cannot `killpg` its own group without dying, so it finds the other members
in /proc (Linux) and kills them one by one; elsewhere this does nothing. A process that left the
group (setsid, setpgid: a daemon) is out of reach, which is why tasks must not start daemons.

The child is a child subreaper, so every descendant whose parent ends is re-parented to it: when
it has no children at all, nothing of the task is left, and the scan of /proc (a few ms on a
busy host, after every attempt) is skipped. That is the common case, and the hot path.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path

log = logging.getLogger("treadle.worker.child")

PROC = Path("/proc")
_HAS_PROC = PROC.is_dir()
#: prctl option: re-parent orphaned descendants to the caller.
PR_SET_CHILD_SUBREAPER = 36

#: Sweeps before giving up on a group that keeps growing (a fork bomb outpaces one pass).
MAX_SWEEPS = 50

#: Pause between sweeps, seconds: lets a SIGKILLed process leave the process table.
SWEEP_PAUSE_S = 0.01


def become_subreaper() -> None:
    """Have orphaned descendants re-parented to this process (Linux), see the module docstring."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def has_children() -> bool:
    """True unless this process certainly has no child process (True where it cannot tell)."""
    # Plain os calls, not pathlib's glob: this runs after every attempt of a task process.
    tasks = f"{PROC}/self/task"
    try:
        for thread in os.listdir(tasks):
            with open(f"{tasks}/{thread}/children", "rb") as f:
                if f.read().strip():
                    return True
    except OSError:  # a thread ended while being looked at, or no /proc: cannot tell
        return True
    return False


def kill_stray_processes() -> list[int]:
    """SIGKILL every live process in this process's group but itself; return the pids killed.

    Sweeps until a pass finds none (at most MAX_SWEEPS), reaping the killed processes that are
    this process's own children so that they do not linger as zombies.
    """
    if not _HAS_PROC or not has_children():
        return []
    pgid, me = os.getpgid(0), os.getpid()
    killed: list[int] = []
    for _ in range(MAX_SWEEPS):
        members = group_members(pgid, exclude=me)
        if not members:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        _reap(killed)
        time.sleep(SWEEP_PAUSE_S)
    else:
        log.error(
            "processes left by a task kept appearing; some may still run",
            extra={"event": "attempt.containment_incomplete", "pgid": pgid},
        )
    _reap(killed)
    pids = sorted(set(killed))
    if pids:
        # The child's log handler may print the message alone: the pids go in it too.
        log.warning(
            "killed processes a task left running: %s",
            " ".join(map(str, pids)),
            extra={"event": "attempt.strays_killed", "pids": pids},
        )
    return pids


def group_members(pgid: int, *, exclude: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group `pgid`, except `exclude`."""
    found: list[int] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def _reap(pids: list[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's children and have ended."""
    for pid in set(pids):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
