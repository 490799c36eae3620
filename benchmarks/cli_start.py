"""CLI cold start: CPU seconds one `treadle` command costs, from exec to exit.

A fresh TREADLE_HOME with a SQLite database (migrated), one DAG synced and one run triggered;
then each command below runs `--repeat` times as a new process (`python -m treadle.cli ...`)
and the CPU it used (user + system, from the kernel's child accounting) is recorded. Reports
the median and minimum per command next to the target, and which heavy modules each command
imported (Alembic must stay out of the read commands). `--database URL` measures against
another database (PostgreSQL: an empty database the script may migrate). Prints one JSON object.

Beside the commands it measures the floor no treadle change moves: an interpreter importing the
libraries every database command needs (SQLAlchemy; on PostgreSQL also its dialect package and
psycopg), and says how far above it each command is. `--baseline SRC` measures another treadle
source tree too (`git worktree add /tmp/base COMMIT`, then `--baseline /tmp/base/src`). The
floor, the baseline and this code run in turn, round by round, so each figure saw the same
minutes of a machine whose speed drifts.
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


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """The HEAVY modules `treadle ARGS` imports."""
    probe = PROBE.format(heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, check=False
    )
    line = next((x for x in done.stderr.splitlines() if x.startswith("HEAVY=")), "HEAVY=")
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


#: What a database command of each backend cannot do without: the libraries it reads through,
#: and the same exit as the CLI's (`gc.freeze()`, so the floor is not raised by a collection
#: the CLI skips).
LIBRARY_FLOOR = {
    "sqlite": "import sqlalchemy, sqlalchemy.dialects.sqlite, sqlite3, gc; gc.freeze()",
    "postgresql": "import sqlalchemy, sqlalchemy.dialects.postgresql, psycopg, gc; gc.freeze()",
}


def backend_of(url: str) -> str:
    """sqlite, postgresql or mysql: the URL's scheme without its driver."""
    scheme = url.split(":", 1)[0].split("+")[0]
    return {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)


def _median_figures(samples: list[float]) -> dict[str, Any]:
    quartiles = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
    return {
        "cpu_s_median": round(statistics.median(samples), 3),
        "cpu_s_quartiles": [round(quartiles[0], 3), round(quartiles[2], 3)],
        "cpu_s_min": round(min(samples), 3),
    }


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds of one process running ARGV to completion (which must succeed)."""
    before = _child_cpu()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    spent = _child_cpu() - before
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
    return spent


def run(database_url: str | None, repeat: int, baseline: Path | None) -> dict[str, Any]:
    """Each command `repeat` times, interleaved round by round with the library floor (and the
    same command on the `baseline` source tree), so that every figure saw the same minutes."""
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
        old_env = None
        if baseline is not None:
            old_env = {**env, "PYTHONPATH": str(baseline)}
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(baseline)], check=True)
        floor_code = LIBRARY_FLOOR.get(backend_of(url))
        floor: list[float] = []
        samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
        before: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(repeat):
            if floor_code is not None:
                floor.append(cpu_of([sys.executable, "-c", floor_code], env))
            for name, args in COMMANDS.items():
                argv = [sys.executable, "-m", "treadle.cli", *args]
                if old_env is not None:
                    before[name].append(cpu_of(argv, old_env))
                samples[name].append(cpu_of(argv, env))
        figures: dict[str, Any] = {}
        for name, args in COMMANDS.items():
            median = statistics.median(samples[name])
            figures[name] = {
                **_median_figures(samples[name]),
                "heavy_modules_imported": heavy_imports(args, env),
                **({"target_cpu_s": TARGET_S, "meets_target": median < TARGET_S} if name in TARGETED else {}),
            }
            if floor:
                over = [s - f for s, f in zip(samples[name], floor, strict=True)]
                figures[name]["cpu_s_over_library_floor"] = round(statistics.median(over), 3)
            if old_env is not None:
                figures[name]["baseline"] = _median_figures(before[name])
        return {
            "library_floor": {"imports": floor_code, **(_median_figures(floor) if floor else {})},
            "commands": figures,
        }


def python_floor(repeat: int) -> float:
    """CPU seconds of an interpreter that imports nothing, median."""
    return round(
        statistics.median(cpu_of([sys.executable, "-c", "pass"], dict(os.environ)) for _ in range(repeat)), 3
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", default=None, help="database URL (default: a new SQLite file)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a `src` folder of other treadle code (a git worktree's) to measure interleaved with this",
    )
    parsed = parser.parse_args()
    load_before = os.getloadavg()[0]
    figures = run(parsed.database, parsed.repeat, parsed.baseline)
    emit(
        {
            "benchmark": "cli_start",
            "database": backend_of(parsed.database or "sqlite://"),
            "repeat": parsed.repeat,
            "baseline": None if parsed.baseline is None else str(parsed.baseline),
            "python_startup_cpu_s": python_floor(parsed.repeat),
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            **figures,
            "machine": machine(),
            "code": code_state(),
        }
    )


if __name__ == "__main__":
    main()
