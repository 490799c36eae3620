"""Files a worker's host keeps per run (manifests, command outputs, attempt logs): removed once
run retention has deleted the run from the database.

Retention runs on the leader, which may be on another host, so each host sweeps its own files:
a worker every RUN_FILES_SWEEP_S while TREADLE_RETENTION_DAYS is set, and `treadle db prune` on
the host it runs on. Only folders whose run has no row any more are removed.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from treadle.engine.retention import pruned_runs
from treadle.store.database import Database

log = logging.getLogger("treadle.worker")

#: Seconds between two sweeps of a worker.
RUN_FILES_SWEEP_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SweptFiles:
    """What one sweep removed."""

    run_folders: int = 0
    log_folders: int = 0


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:  # not there (yet), or unreadable
        return []


def remove_files_of_pruned_runs(db: Database, *, runs_dir: Path, logs_dir: Path) -> SweptFiles:
    """Remove RUNS/<run_id>/ and LOGS/<dag_id>/<run_id>/ of every run the database no longer has,
    and dag folders of the logs left empty."""
    run_folders = _subfolders(runs_dir)
    log_folders = [run for dag in _subfolders(logs_dir) for run in _subfolders(dag)]
    gone = pruned_runs(db, sorted({p.name for p in run_folders + log_folders}))
    removed = SweptFiles(
        run_folders=sum(_remove(p) for p in run_folders if p.name in gone),
        log_folders=sum(_remove(p) for p in log_folders if p.name in gone),
    )
    for dag in _subfolders(logs_dir):
        try:
            dag.rmdir()  # only when empty
        except OSError:
            pass
    if removed.run_folders or removed.log_folders:
        log.info(
            "removed the files of pruned runs",
            extra={
                "event": "worker.run_files_removed",
                "run_folders": removed.run_folders,
                "log_folders": removed.log_folders,
            },
        )
    return removed


def _remove(folder: Path) -> int:
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        log.warning(
            "cannot remove the files of a pruned run",
            extra={"event": "worker.run_files_kept", "path": str(folder), "error": str(exc)},
        )
        return 0
    return 1
