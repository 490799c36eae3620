"""Import a DAG folder: every file on its own, so one bad file never stops the others."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

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


def _module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode(), usedforsecurity=False).hexdigest()[:12]
    return f"treadle_dags_{path.stem}_{digest}"


def load_file(path: Path) -> tuple[list[Dag], LoadError | None]:
    """Import one DAG file afresh and return the DAGs it built, or the error that stopped it."""
    name = _module_name(path)
    sys.modules.pop(name, None)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        with collecting() as built:
            spec.loader.exec_module(module)
    except BaseException as exc:  # a DAG file may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        sys.modules.pop(name, None)
        message = f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc()[-MAX_TRACEBACK_CHARS:]
        return [], LoadError(fileloc=str(path), message=message, traceback=tb)
    for d in built:
        d.fileloc = str(path)
    return built, None


def load_folder(folder: Path) -> FolderLoad:
    """Import every DAG file of `folder`; a DAG id defined twice is an error on the later file."""
    result = FolderLoad()
    for path in dag_files(folder):
        result.files.append(str(path))
        dags, error = load_file(path)
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
