"""DAG folder loading: every file on its own; errors are per file, never fatal."""

from __future__ import annotations

from pathlib import Path

from treadle.authoring.loader import folder_signature, load_folder

GOOD = """
from treadle import dag, task

@task
def hello():
    return "hi"

@dag(dag_id="{dag_id}")
def d():
    hello()
"""


def test_one_bad_file_never_stops_the_others(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD.format(dag_id="good"))
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    (tmp_path / "syntax.py").write_text("def (:\n")
    (tmp_path / "exits.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "dup.py").write_text(GOOD.format(dag_id="good"))
    (tmp_path / "_helper.py").write_text("raise RuntimeError('never imported')\n")

    loaded = load_folder(tmp_path)

    assert list(loaded.dags) == ["good"]
    errors = {Path(k).name: v.message for k, v in loaded.errors.items()}
    # Files load in name order, so dup.py registers "good" first and good.py is the duplicate.
    assert set(errors) == {"broken.py", "syntax.py", "exits.py", "good.py"}
    assert Path(loaded.dags["good"].fileloc).name == "dup.py"
    assert "ModuleNotFoundError" in errors["broken.py"]
    assert "SyntaxError" in errors["syntax.py"]
    assert "SystemExit" in errors["exits.py"]
    assert "duplicate dag id 'good'" in errors["good.py"]


def test_signature_changes_when_a_file_changes(tmp_path: Path) -> None:
    f = tmp_path / "a.py"
    f.write_text(GOOD.format(dag_id="a"))
    before = folder_signature(tmp_path)
    f.write_text(GOOD.format(dag_id="a") + "\n# edited\n")
    assert folder_signature(tmp_path) != before


def test_missing_folder_loads_nothing(tmp_path: Path) -> None:
    loaded = load_folder(tmp_path / "absent")
    assert loaded.dags == {} and loaded.errors == {}


def test_a_file_over_the_import_time_limit_is_a_load_error_naming_the_limit(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD.format(dag_id="good"))
    (tmp_path / "spins.py").write_text("while True:\n    pass\n")
    (tmp_path / "sleeps.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "swallows.py").write_text(
        "import time\ntry:\n    time.sleep(60)\nexcept Exception:\n    pass\n"  # cannot catch the limit
    )

    loaded = load_folder(tmp_path, time_limit_s=0.3)

    assert list(loaded.dags) == ["good"]
    errors = {Path(k).name: v.message for k, v in loaded.errors.items()}
    assert set(errors) == {"spins.py", "sleeps.py", "swallows.py"}
    for message in errors.values():
        assert message.startswith("DagImportTimeout: importing ")
        assert "longer than 0.3 s (TREADLE_DAG_IMPORT_TIMEOUT_SECONDS)" in message
