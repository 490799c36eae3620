"""DAG folder loading: every file on its own; errors are per file, never fatal."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from treadle.authoring.loader import folder_signature, load_folder
from treadle.worker.child import DagCache

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


USES_HELPER = """
import {helper}
from treadle import dag, task

@task(retries={helper}.RETRIES)
def greet():
    return {helper}.VALUE

@dag(dag_id="uses_helper", tags={helper}.TAGS)
def uses_helper():
    greet()
"""


@pytest.fixture
def helper_name(tmp_path: Path) -> Iterator[str]:
    """A module name no other test imports; sys.path and sys.modules are restored afterwards."""
    name = f"helpers_{uuid.uuid4().hex[:8]}"
    path = list(sys.path)
    yield name
    sys.path[:] = path
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


def write_helper(folder: Path, name: str, value: str, *, tag: str = "v1", retries: int = 0) -> None:
    path = folder / f"{name}.py"
    existed = path.exists()
    path.write_text(f"VALUE = {value!r}\nTAGS = [{tag!r}]\nRETRIES = {retries}\n")
    if existed:  # an mtime surely different from the previous write's, whatever the clock's grain
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_a_dag_file_imports_a_module_beside_it(tmp_path: Path, helper_name: str) -> None:
    write_helper(tmp_path, helper_name, "from the helper")
    (tmp_path / "uses.py").write_text(USES_HELPER.format(helper=helper_name))

    loaded = load_folder(tmp_path)

    # The helper defines no DAG: that is no load error.
    assert loaded.errors == {}
    assert list(loaded.dags) == ["uses_helper"]
    assert loaded.dags["uses_helper"].tasks["greet"].fn() == "from the helper"
    assert str(tmp_path) in sys.path and sys.path.index(str(tmp_path)) == len(sys.path) - 1


def test_the_folder_signature_covers_private_modules_and_packages(tmp_path: Path) -> None:
    (tmp_path / "_shared").mkdir()
    (tmp_path / "_shared" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "junk.py").write_text("")
    before = folder_signature(tmp_path)
    assert [Path(p).relative_to(tmp_path).as_posix() for p, _, _ in before] == ["_shared/__init__.py"]
    (tmp_path / "_shared" / "__init__.py").write_text("X = 22\n")
    assert folder_signature(tmp_path) != before


def test_a_changed_helper_is_imported_afresh_by_the_fork_servers_cache(
    tmp_path: Path, helper_name: str
) -> None:
    write_helper(tmp_path, helper_name, "one")
    (tmp_path / "uses.py").write_text(USES_HELPER.format(helper=helper_name))
    (tmp_path / "other.py").write_text(GOOD.format(dag_id="other"))
    cache = DagCache(tmp_path)
    assert cache.dags["uses_helper"].tasks["greet"].fn() == "one"
    assert cache.refresh(()) == []  # nothing changed, nothing imported

    write_helper(tmp_path, helper_name, "two!")
    imported = cache.refresh(())

    assert cache.dags["uses_helper"].tasks["greet"].fn() == "two!"
    # Any DAG file may use the helper: every one is imported again.
    assert {Path(p).name for p in imported} == {f"{helper_name}.py", "uses.py", "other.py"}


def test_a_task_process_picks_up_a_changed_helper_with_the_new_version(
    tmp_path: Path, helper_name: str
) -> None:
    write_helper(tmp_path, helper_name, "one")
    (tmp_path / "uses.py").write_text(USES_HELPER.format(helper=helper_name))
    cache = DagCache(tmp_path)
    old = cache.dags["uses_helper"].structure()

    write_helper(tmp_path, helper_name, "two!", tag="v2")
    new_hash = dataclasses.replace(old, tags=("v2",)).content_hash()
    found = cache.get("uses_helper", new_hash)

    assert found.tasks["greet"].fn() == "two!"
    assert cache.hashes["uses_helper"] == new_hash
