"""Import a DAG folder: every file on its own, so one bad file never stops the others.

A file may take at most a time limit to import (a signal interrupts it, in the main thread of the
process that imports); worker/dag_processor.py runs whole-folder imports in a process of their
own, so even a file stuck where no signal reaches it cannot freeze a worker or a command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from treadle.authoring.specs import Dag, collecting

#: Upper bound on a stored traceback, so one pathological file cannot bloat the database.
MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadError:
    """Why one DAG file could not be loaded."""

    fileloc: str
    message: str
    traceback: str


@dataclass(slots=True)
class FolderLoad:
    """What one pass over a DAG folder found."""

    dags: dict[str, Dag] = field(default_factory=dict)
    errors: dict[str, LoadError] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def dag_files(folder: Path) -> list[Path]:
    """Return the Python files of a DAG folder (recursively; names starting with `_` or `.` skipped)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.rglob("*.py")
        if not any(part.startswith((".", "_")) for part in p.relative_to(folder).parts)
    )


def folder_signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Return (path, mtime_ns, size) of every DAG file: changes when any file changes."""
    sig = []
    for p in dag_files(folder):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        sig.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(sig)


class DagImportTimeout(BaseException):
    """A DAG file took longer than its time limit to import (a BaseException, so that a DAG file's
    own `except Exception` cannot swallow it)."""


def time_limit_message(path: Path | str, limit_s: float) -> str:
    """The load error of a file that did not import within `limit_s`."""
    return (
        f"DagImportTimeout: importing {path} took longer than {limit_s:g} s "
        "(TREADLE_DAG_IMPORT_TIMEOUT_SECONDS); move slow work out of import time"
    )


@contextmanager
def _time_limit(path: Path, limit_s: float | None) -> Iterator[None]:
    """Interrupt the block after `limit_s` (only where signals can be used: the main thread)."""
    if limit_s is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise DagImportTimeout(time_limit_message(path, limit_s))

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode(), usedforsecurity=False).hexdigest()[:12]
    return f"treadle_dags_{path.stem}_{digest}"


def load_file(path: Path, *, time_limit_s: float | None = None) -> tuple[list[Dag], LoadError | None]:
    """Import one DAG file afresh and return the DAGs it built, or the error that stopped it
    (including running past `time_limit_s`)."""
    name = _module_name(path)
    sys.modules.pop(name, None)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        with collecting() as built, _time_limit(path, time_limit_s):
            spec.loader.exec_module(module)
    except BaseException as exc:  # a DAG file may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        sys.modules.pop(name, None)
        if isinstance(exc, DagImportTimeout):
            return [], LoadError(fileloc=str(path), message=str(exc), traceback="")
        message = f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc()[-MAX_TRACEBACK_CHARS:]
        return [], LoadError(fileloc=str(path), message=message, traceback=tb)
    for d in built:
        d.fileloc = str(path)
    return built, None


def load_folder(
    folder: Path,
    *,
    time_limit_s: float | None = None,
    skip: Collection[str] = (),
    on_file: Callable[[str], None] | None = None,
) -> FolderLoad:
    """Import every DAG file of `folder`; a DAG id defined twice is an error on the later file.

    Each file gets `time_limit_s` to import. Files in `skip` are listed but not imported (the
    caller records their errors); `on_file` hears of each file before its import starts.
    """
    result = FolderLoad()
    for path in dag_files(folder):
        result.files.append(str(path))
        if str(path) in skip:
            continue
        if on_file is not None:
            on_file(str(path))
        dags, error = load_file(path, time_limit_s=time_limit_s)
        if error is not None:
            result.errors[error.fileloc] = error
            continue
        for d in dags:
            if d.dag_id in result.dags:
                other = result.dags[d.dag_id].fileloc
                result.errors[str(path)] = LoadError(
                    fileloc=str(path),
                    message=f"DagDefinitionError: duplicate dag id {d.dag_id!r} (also in {other})",
                    traceback="",
                )
                continue
            result.dags[d.dag_id] = d
    return result
