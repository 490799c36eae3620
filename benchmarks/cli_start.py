"""CLI cold start: CPU seconds one `treadle` command costs, from exec to exit.

A fresh TREADLE_HOME with a SQLite database (migrated), one DAG synced and one run triggered;
then each command below runs `--repeat` times as a new process (`python -m treadle.cli ...`)
and the CPU it used (user + system, from the kernel's child accounting) is recorded. Reports
the median and minimum per command next to the target, and which heavy modules each command
imported (Alembic must stay out of the read commands). `--database URL` measures against
another database (PostgreSQL: an empty database the script may migrate). Prints one JSON object.

Beside the commands it measures the floor no treadle change moves: an interpreter importing the
libraries every database command needs (SQLAlchemy; on PostgreSQL also its dialect package and
psycopg), measured in the same minutes, and says how far above it each command is.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from _common import cli, code_state, emit, machine, treadle_env

#: CPU seconds (user + system) a command may take before it does its work.
TARGET_S = 0.3
#: The commands the target applies to, and others shown for comparison.
COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "runs list --json": ["runs", "list", "--json"],
    "runs list": ["runs", "list"],
    "dags list --json": ["dags", "list", "--json"],
}
TARGETED = ("--help", "runs list --json")
#: Modules whose presence in a read command is a regression worth seeing in the figures.
HEAVY = ("alembic", "fastapi", "jsonschema", "psycopg", "uvicorn", "sqlalchemy.dialects.mysql")

DAG = textwrap.dedent(
    """\
    from treadle import dag, task


    @task
    def hello() -> int:
        return 1


    @dag(dag_id="bench_cli")
    def bench_cli() -> None:
        hello()
    """
)

PROBE = """\
import sys
from treadle.cli.main import main
try:
    main()
finally:
    heavy = sorted(m for m in {heavy!r} if m in sys.modules)
    print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(args: list[str], env: dict[str, str]) -> float:
    """CPU seconds of one `treadle ARGS` process."""
    before = _child_cpu()
    done = subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args], env=env, capture_output=True, check=False
    )
    spent = _child_cpu() - before
    if done.returncode != 0:
        raise RuntimeError(f"treadle {' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
    return spent


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """The HEAVY modules `treadle ARGS` imports."""
    probe = PROBE.format(heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, check=False
    )
    line = next((x for x in done.stderr.splitlines() if x.startswith("HEAVY=")), "HEAVY=")
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


def run(database_url: str | None, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="treadle-cli-start-") as tmp:
        root = Path(tmp)
        dags = root / "dags"
        dags.mkdir()
        (dags / "bench_cli.py").write_text(DAG)
        url = database_url or f"sqlite:///{root / 'treadle.db'}"
        env = treadle_env(database_url=url, dags_folder=dags, home=root / "home")
        # Measure what an installed treadle costs: with bytecode caches (written by the
        # set-up commands below if missing), not recompiling every module on every start.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cli(["db", "upgrade"], env)
        cli(["dags", "sync"], env)
        cli(["dags", "trigger", "bench_cli"], env)
        figures: dict[str, Any] = {}
        for name, args in COMMANDS.items():
            samples = [measure(args, env) for _ in range(repeat)]
            median = statistics.median(samples)
            figures[name] = {
                "cpu_s_median": round(median, 3),
                "cpu_s_min": round(min(samples), 3),
                "heavy_modules_imported": heavy_imports(args, env),
                **({"target_cpu_s": TARGET_S, "meets_target": median < TARGET_S} if name in TARGETED else {}),
            }
    return figures


def python_floor(repeat: int, code: str = "pass") -> float:
    """CPU seconds of an interpreter running `code` (by default importing nothing), median."""
    samples = []
    for _ in range(repeat):
        before = _child_cpu()
        subprocess.run([sys.executable, "-c", code], check=True)
        samples.append(_child_cpu() - before)
    return round(statistics.median(samples), 3)


#: What a database command of each backend cannot do without: the libraries it reads through,
#: and the same exit as the CLI's (`gc.freeze()`, so the floor is not raised by a collection
#: the CLI skips).
LIBRARY_FLOOR = {
    "sqlite": "import sqlalchemy, sqlalchemy.dialects.sqlite, sqlite3, gc; gc.freeze()",
    "postgresql": "import sqlalchemy, sqlalchemy.dialects.postgresql, psycopg, gc; gc.freeze()",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", default=None, help="database URL (default: a new SQLite file)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command")
    parsed = parser.parse_args()
    figures = run(parsed.database, parsed.repeat)
    database = "sqlite" if parsed.database is None else parsed.database.split(":", 1)[0].split("+")[0]
    database = "postgresql" if database == "postgres" else database
    library = python_floor(parsed.repeat, LIBRARY_FLOOR[database]) if database in LIBRARY_FLOOR else None
    if library is not None:
        for figure in figures.values():
            figure["cpu_s_over_library_floor"] = round(figure["cpu_s_median"] - library, 3)
    emit(
        {
            "benchmark": "cli_start",
            "database": database,
            "repeat": parsed.repeat,
            "python_startup_cpu_s": python_floor(parsed.repeat),
            "library_floor": {"imports": LIBRARY_FLOOR.get(database), "cpu_s_median": library},
            "load_average_1m": round(os.getloadavg()[0], 2),
            "commands": figures,
            "machine": machine(),
            "code": code_state(),
        }
    )


if __name__ == "__main__":
    main()
