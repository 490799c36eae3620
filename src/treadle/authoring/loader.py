"""Import a DAG folder: every file on its own, so one bad file never stops the others.

A file may take at most a time limit to import (a signal interrupts it, in the main thread of the
process that imports); worker/dag_processor.py runs whole-folder imports in a process of their
own, so even a file stuck where no signal reaches it cannot freeze a worker or a command.

The folder is importable: it is put on `sys.path` (last, so a module of the folder never hides an
installed one), and a DAG file may `import helpers` from a module beside it. A module that
defines no DAG is no load error. A long-lived importer (a worker's fork server, its task
processes) keeps a `FolderModules`: a module of the folder whose file changed is dropped from
`sys.modules`, and every DAG file is imported again, so none keeps running the old helper.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from treadle.authoring.specs import Dag, collecting

#: Upper bound on a stored traceback, so one pathological file cannot bloat the database.
MAX_TRACEBACK_CHARS = 20_000
#: Module names DAG files are imported under (never the names their helpers are imported as).
DAG_MODULE_PREFIX = "treadle_dags_"

#: (mtime_ns, size) of a file.
FileStat = tuple[int, int]


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


def python_files(folder: Path) -> list[Path]:
    """Every Python file of a DAG folder: its DAG files and the modules they may import
    (`_`-prefixed ones and packages included; hidden folders and `__pycache__` skipped)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.rglob("*.py")
        if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(folder).parts)
    )


def folder_signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Return (path, mtime_ns, size) of every Python file of the folder (DAG files and the modules
    they import): changes when any of them changes."""
    sig = []
    for p in python_files(folder):
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
    return f"{DAG_MODULE_PREFIX}{path.stem}_{digest}"


def make_importable(folder: Path) -> None:
    """Put the DAG folder on `sys.path`, so its files can import the modules beside them.

    Appended, as Airflow does: a helper named like an installed module (`utils`, `requests`) is
    shadowed by it rather than replacing it for treadle and every other importer.
    """
    path = os.path.abspath(folder)
    if path not in sys.path:
        sys.path.append(path)


class FolderModules:
    """The modules DAG files imported from their folder (`import helpers`) and the stat each
    file had when imported, so that a changed helper is imported afresh rather than reused from
    `sys.modules` by the next import of a DAG file that uses it."""

    def __init__(self, folder: Path) -> None:
        self.root = os.path.abspath(folder) + os.sep
        #: module name -> (absolute file, stat when imported; None if unknown).
        self.imported: dict[str, tuple[str, FileStat | None]] = {}

    def forget_changed(self) -> list[str]:
        """Drop from `sys.modules` every module whose file changed or vanished; return their names."""
        changed = [
            name
            for name, (path, stat) in self.imported.items()
            if stat is None or _stat(path) != stat or name not in sys.modules
        ]
        for name in changed:
            sys.modules.pop(name, None)
            del self.imported[name]
        return changed

    def note_imported(self, before: Mapping[str, FileStat]) -> None:
        """Record the folder's modules imported since the last call, with the stats their files
        had in `before` (taken before the import, so an edit during it is not missed; a file
        missing from `before` is looked at now)."""
        known = {os.path.abspath(path): stat for path, stat in before.items()}
        for name, module in list(sys.modules.items()):
            if name in self.imported or name.startswith(DAG_MODULE_PREFIX):
                continue
            file = getattr(module, "__file__", None)
            if not isinstance(file, str) or not os.path.abspath(file).startswith(self.root):
                continue
            path = os.path.abspath(file)
            self.imported[name] = (path, known[path] if path in known else _stat(path))


def _stat(path: str) -> FileStat | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


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
    caller records their errors); `on_file` hears of each file before its import starts. The
    folder is put on `sys.path` first (make_importable).
    """
    make_importable(folder)
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
