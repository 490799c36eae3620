"""`treadle tasks test` finds the DAG where the registry recorded it and treats --conf exactly
as a trigger does: params checked, defaults filled in; a DAG without params takes any conf."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from treadle.authoring.loader import load_folder
from treadle.cli.main import cli
from treadle.engine.dags import sync_dags
from treadle.engine.runs import trigger_run
from treadle.errors import ParamsInvalid
from treadle.store.database import Database

DAG_FILE = textwrap.dedent(
    """\
    from treadle import Param, TaskContext, dag, task


    @task
    def show(context: TaskContext) -> dict:
        return dict(context.params)


    @dag(dag_id="with_params", params={"limit": Param(10, type="integer", minimum=1), "region": "north"})
    def with_params() -> None:
        show()


    @dag(dag_id="without_params")
    def without_params() -> None:
        show()
    """
)


@pytest.fixture
def registered(tmp_path: Path, sqlite_url: str) -> dict[str, str]:
    """A DAG file registered in the database from a folder that is not TREADLE_DAGS_FOLDER."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "tested.py").write_text(DAG_FILE)
    loaded = load_folder(folder)
    db = Database(sqlite_url)
    sync_dags(
        db, structures=[d.structure() for d in loaded.dags.values()], scanned_files=loaded.files, errors={}
    )
    db.dispose()
    empty = tmp_path / "default-dags"
    empty.mkdir()
    return {
        "TREADLE_HOME": str(tmp_path / "home"),
        "TREADLE_DATABASE_URL": sqlite_url,
        "TREADLE_DAGS_FOLDER": str(empty),
    }


def _tasks_test(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, ["tasks", "test", *args], env=env)


def test_the_registered_file_is_found_and_params_get_their_defaults(registered: dict[str, str]) -> None:
    done = _tasks_test(registered, "with_params", "show", "--conf", '{"limit": 3}')
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"limit": 3, "region": "north"}


@pytest.mark.parametrize(
    ("conf", "problem"),
    [
        ('{"limit": 0}', "$.limit"),
        ('{"limit": "ten"}', "$.limit"),
        ('{"limt": 3}', "limt"),
    ],
)
def test_a_conf_a_trigger_refuses_is_refused_with_the_same_message(
    registered: dict[str, str], conf: str, problem: str
) -> None:
    done = _tasks_test(registered, "with_params", "show", "--conf", conf)
    db = Database(registered["TREADLE_DATABASE_URL"])
    with pytest.raises(ParamsInvalid) as refused:
        trigger_run(db, "with_params", conf=json.loads(conf), triggered_by="test")
    db.dispose()
    assert done.exit_code == 1
    assert f"error: {refused.value}" in done.output
    assert problem in done.output


def test_a_dag_without_params_takes_any_conf_as_given_in_tests_and_triggers(
    registered: dict[str, str],
) -> None:
    done = _tasks_test(registered, "without_params", "show", "--conf", '{"anything": [1, 2]}')
    db = Database(registered["TREADLE_DATABASE_URL"])
    run = trigger_run(db, "without_params", conf={"anything": [1, 2]}, triggered_by="test")
    db.dispose()
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == run.conf == {"anything": [1, 2]}


def test_without_a_database_the_dag_folder_is_used(tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "tested.py").write_text(DAG_FILE)
    env = {
        "TREADLE_HOME": str(tmp_path / "home"),
        "TREADLE_DATABASE_URL": f"sqlite:///{tmp_path / 'never-made.db'}",
        "TREADLE_DAGS_FOLDER": str(folder),
    }
    done = _tasks_test(env, "with_params", "show")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"limit": 10, "region": "north"}
    assert not (tmp_path / "never-made.db").exists()

    missing = _tasks_test(env, "nosuch", "show")
    assert missing.exit_code == 1
    assert f"error: no DAG 'nosuch' in {folder} (TREADLE_DAGS_FOLDER)" in missing.output
