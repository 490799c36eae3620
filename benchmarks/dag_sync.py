"""`dags sync` of a large DAG folder: how long the import pass and the registration take.

Writes `--files` DAG files (one DAG each, three tasks, half of them on a cron schedule) into a
temporary folder, migrates a fresh database (SQLite by default, `--database URL` for another)
and syncs the folder three times in this process, as `treadle dags sync` does: the first sync
registers every DAG, the second finds nothing changed, the third runs after a tenth of the files
were deleted (their DAGs become inactive). Each sync reports the folder import (processor
processes) and the registration transaction separately. Prints one JSON object.

The processors read a DAG file's `__pycache__` but never write one (`python -B`, whatever
PYTHONDONTWRITEBYTECODE says), so here every sync compiles every file, as a user's syncs do
until something else (a worker's fork server) has written the bytecode.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import code_state, emit, machine

from treadle.engine.dags import sync_dags
from treadle.store import migrate
from treadle.store.database import Database
from treadle.worker.dag_processor import parse_folder

#: Seconds a whole `dags sync` of 10,000 DAG files may take.
TARGET_S = 10.0

DAG = textwrap.dedent(
    """\
    from treadle import dag, task


    @task
    def extract() -> int:
        return 1


    @task
    def transform(x: int) -> int:
        return x + 1


    @task
    def load(x: int) -> None:
        return None


    @dag(dag_id="bench_sync_{n:05d}"{schedule})
    def bench_sync_{n:05d}() -> None:
        load(transform(extract()))
    """
)


def write_folder(folder: Path, files: int) -> None:
    for n in range(files):
        schedule = ', schedule="*/5 * * * *"' if n % 2 else ""
        (folder / f"dag_{n:05d}.py").write_text(DAG.format(n=n, schedule=schedule))


def one_sync(db: Database, folder: Path) -> dict[str, Any]:
    started = time.perf_counter()
    parsed = parse_folder(folder, file_limit_s=30.0)
    parsed_at = time.perf_counter()
    report = sync_dags(
        db,
        structures=list(parsed.structures.values()),
        scanned_files=parsed.files,
        errors=parsed.errors,
        folder=str(folder),
    )
    done = time.perf_counter()
    return {
        "dags": report.dags,
        "errors": report.errors,
        "deactivated": len(report.deactivated),
        "import_s": round(parsed_at - started, 2),
        "register_s": round(done - parsed_at, 2),
        "total_s": round(done - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--database", default=None, help="database URL (default: a new SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treadle-dag-sync-") as tmp:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        write_folder(folder, args.files)
        db = Database(args.database or f"sqlite:///{root / 'treadle.db'}")
        migrate.upgrade(db)
        first = one_sync(db, folder)
        second = one_sync(db, folder)
        for path in sorted(folder.glob("*.py"))[::10]:
            path.unlink()
        third = one_sync(db, folder)
        db.dispose()
    emit(
        {
            "benchmark": "dag_sync",
            "files": args.files,
            "database": "sqlite" if args.database is None else args.database.split(":", 1)[0],
            "first_sync": first,
            "unchanged_sync": second,
            "after_deleting_a_tenth": third,
            "target_s": TARGET_S,
            "meets_target": max(first["total_s"], second["total_s"], third["total_s"]) < TARGET_S
            if args.files >= 10_000
            else None,
            "machine": machine(),
            "code": code_state(),
        }
    )


if __name__ == "__main__":
    main()
