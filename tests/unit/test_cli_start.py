"""Everyday read commands import only what they need (the CLI's cold start, docs/performance.md).

Each command runs as a real process on a real SQLite file; a probe prints which of the modules
a command must not need were imported. The runs are masked without building their DAG
versions: the params schema is read from the stored structure, and must mask as the built
version does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from treadle import Param, dag, task
from treadle.domain.dag_version import DagStructure
from treadle.domain.secret_params import params_schema_in
from treadle.engine import queries
from treadle.engine.dags import sync_dags
from treadle.engine.runs import trigger_run
from treadle.engine.versions import params_schemas_of, versions_of
from treadle.store import migrate
from treadle.store.database import Database

CANARY = "canary-7c21"

#: Modules that building or validating DAG structures needs, and that no command below may import.
STRUCTURE_MODULES = (
    "treadle.domain.dag_version",
    "treadle.domain.contract",
    "treadle.domain.timetable",
    "jsonschema",
)
#: Never needed by a read: migrations, the web extra, other dialects' drivers.
NEVER = (
    "alembic",
    "fastapi",
    "psycopg",
    "pymysql",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.mysql",
)

PROBE = """\
import sys
from treadle.cli.main import main
watched = {watched!r}
try:
    main()
finally:
    print("IMPORTED=" + json.dumps(sorted(m for m in watched if m in sys.modules)), file=sys.stderr)
"""


@task
def uses() -> int:
    return 1


@dag(dag_id="guarded", params={"password": Param("", type="string", format="password"), "day": Param("x")})
def guarded() -> None:
    uses()


@pytest.fixture
def filled(tmp_path: Path) -> tuple[str, str]:
    """A migrated SQLite file with one DAG whose params include a secret, and one run of it."""
    url = f"sqlite:///{tmp_path / 'treadle.db'}"
    db = Database(url)
    migrate.upgrade(db)
    sync_dags(db, structures=[guarded.structure()], scanned_files=[], errors={})
    run = trigger_run(db, "guarded", conf={"password": CANARY, "day": "d1"}, triggered_by="test")
    db.dispose()
    return url, run.run_id


def _imported(args: list[str], url: str, home: Path, watched: tuple[str, ...]) -> tuple[str, list[str]]:
    """(stdout, the watched modules imported) of `treadle ARGS` in a new process."""
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + PROBE.format(watched=watched), *args],
        env={"TREADLE_DATABASE_URL": url, "TREADLE_HOME": str(home), "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if x.startswith("IMPORTED="))
    return done.stdout, json.loads(line.removeprefix("IMPORTED="))


def test_runs_list_masks_secrets_without_importing_dag_structures(
    filled: tuple[str, str], tmp_path: Path
) -> None:
    url, run_id = filled
    out, imported = _imported(["runs", "list", "--json"], url, tmp_path / "home", STRUCTURE_MODULES + NEVER)
    assert imported == []
    (run,) = json.loads(out)
    assert run["run_id"] == run_id
    assert run["conf"] == {"password": "***", "day": "d1"}
    assert CANARY not in out


def test_runs_list_as_a_table_imports_no_dag_structures(filled: tuple[str, str], tmp_path: Path) -> None:
    url, run_id = filled
    out, imported = _imported(["runs", "list"], url, tmp_path / "home", STRUCTURE_MODULES + NEVER)
    assert imported == []
    assert run_id in out


def test_dags_list_imports_no_params_validation(filled: tuple[str, str], tmp_path: Path) -> None:
    """The schedule column needs the DAG structures, not jsonschema (only `dags trigger` does)."""
    url, _ = filled
    out, imported = _imported(["dags", "list", "--json"], url, tmp_path / "home", ("jsonschema", *NEVER))
    assert imported == []
    assert [d["dag_id"] for d in json.loads(out)] == ["guarded"]


def test_the_stored_params_schema_is_the_structures() -> None:
    structure = guarded.structure()
    assert params_schema_in(structure.to_json()) == structure.params_schema
    assert params_schema_in(DagStructure.from_json(structure.to_json()).to_json()) == structure.params_schema
    assert params_schema_in({"dag_id": "bare"}) is None


def test_params_schemas_come_from_built_versions_or_from_one_read(filled: tuple[str, str]) -> None:
    url, run_id = filled
    db = Database(url)
    (run,) = queries.list_runs(db)
    version_id = run.dag_version_id
    assert db.version_cache == {}  # listing runs built no version
    with db.engine.connect() as conn:
        read = params_schemas_of(db, conn, [version_id])
        built = versions_of(db, conn, [version_id])[version_id].structure.params_schema
        assert read == {version_id: built}
        assert db.params_schema_cache == {version_id: built}
        # With the version built, the same schema comes from it; the masking is the same either way.
        db.params_schema_cache.clear()
        assert params_schemas_of(db, conn, [version_id]) == {version_id: built}
        assert db.params_schema_cache == {}
    (again,) = queries.list_runs(db)
    assert again.conf == run.conf == {"password": "***", "day": "d1"}
    assert queries.run_detail(db, run_id).run.conf == run.conf
    db.dispose()


def _open_files_under(folder: Path) -> list[str]:
    """Files under `folder` this process holds open."""
    held = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink()
        except OSError:
            continue
        if str(target).startswith(str(folder)):
            held.append(str(target))
    return held


def test_a_command_closes_the_database_it_opened(filled: tuple[str, str], tmp_path: Path) -> None:
    """In-process invocations (as the tests make) leave no connection behind, any more than a
    command's process does before it exits."""
    from click.testing import CliRunner

    from treadle.cli.main import cli

    url, run_id = filled
    env = {"TREADLE_DATABASE_URL": url, "TREADLE_HOME": str(tmp_path / "home")}
    for args in (["runs", "list", "--json"], ["runs", "show", run_id], ["dags", "list"]):
        done = CliRunner().invoke(cli, args, env=env)
        assert done.exit_code == 0, done.output
        assert _open_files_under(tmp_path) == [], args


@pytest.mark.parametrize(
    ("files", "folder"),
    [
        ([], ""),
        (["/srv/dags/a.py", "/srv/dags/team/b.py"], "/srv/dags"),
        (["examples/dags/a.py"], "examples/dags"),
        (["/a.py", "/b.py"], ""),  # the root is no folder worth naming
        (["rel/a.py", "/abs/b.py"], ""),  # relative and absolute paths share none
        (["", "/srv/dags/a.py"], ""),  # a DAG without a recorded file
    ],
)
def test_the_dag_tables_folder_is_the_one_every_file_lies_in(files: list[str], folder: str) -> None:
    from treadle.cli.dags import common_folder

    assert common_folder(files) == folder


def test_the_dag_table_names_the_folder_once_and_each_file_from_there(
    filled: tuple[str, str], tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from treadle.cli.main import cli

    url, _ = filled
    env = {"TREADLE_DATABASE_URL": url, "TREADLE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    shown = CliRunner().invoke(cli, ["dags", "list"], env=env)
    assert shown.exit_code == 0, shown.output
    here = Path(__file__).resolve()
    assert shown.output.splitlines()[0] == f"DAGs (files in {here.parent}/)"
    (row,) = [line for line in shown.output.splitlines() if line.startswith("guarded")]
    assert row.rstrip().endswith(f"  {here.name}") and str(here.parent) not in row
    listed = CliRunner().invoke(cli, ["dags", "list", "--json"], env=env)
    assert [d["fileloc"] for d in json.loads(listed.output)] == [guarded.structure().fileloc]
