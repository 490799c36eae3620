"""The DAG processor: a folder parsed in processes of its own, each file within a time limit."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_loader import GOOD
from treadle.authoring.loader import DAG_MODULE_PREFIX, load_folder
from treadle.worker.dag_processor import FILES_PER_PROCESSOR, ParsedFolder, parse_folder, processor_count

#: Blocks SIGALRM, so the loader's own limit cannot interrupt the loop: only a kill ends it.
UNINTERRUPTIBLE = """
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
while True:
    pass
"""


def test_files_that_hang_or_end_the_process_are_load_errors_and_the_rest_is_parsed(tmp_path: Path) -> None:
    (tmp_path / "a_good.py").write_text(GOOD.format(dag_id="first"))
    (tmp_path / "b_stuck.py").write_text(UNINTERRUPTIBLE)
    (tmp_path / "c_exits.py").write_text("import os\nos._exit(7)\n")
    (tmp_path / "d_sleeps.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "e_good.py").write_text(GOOD.format(dag_id="second"))

    parsed = parse_folder(tmp_path, file_limit_s=0.5)

    assert sorted(parsed.structures) == ["first", "second"]
    assert [Path(f).name for f in parsed.files] == [
        "a_good.py",
        "b_stuck.py",
        "c_exits.py",
        "d_sleeps.py",
        "e_good.py",
    ]
    errors = {Path(f).name: message for f, (message, _) in parsed.errors.items()}
    assert set(errors) == {"b_stuck.py", "c_exits.py", "d_sleeps.py"}
    assert (
        errors["b_stuck.py"].startswith("DagImportTimeout")
        and "(the import was killed)" in errors["b_stuck.py"]
    )
    assert "exit code 7" in errors["c_exits.py"]
    assert errors["d_sleeps.py"].startswith("DagImportTimeout")
    assert {Path(f).name for f in parsed.timed_out} == {"b_stuck.py", "d_sleeps.py"}


#: A DAG file with three tasks whose DAG id, schedule and helper use vary with `n`.
NUMBERED = """
from treadle import dag, task
from {helper} import scale


@task(retries={n} % 3)
def extract() -> int:
    return scale({n})


@task
def load(x: int) -> None:
    return None


@dag(dag_id="numbered_{n:03d}"{schedule})
def numbered() -> None:
    load(extract())
"""


def _write_mixed_folder(folder: Path, helper: str) -> None:
    """Sixty good files, a helper beside them, and broken files of every kind among them (one
    defines a DAG id an earlier file defines)."""
    (folder / f"{helper}.py").write_text("def scale(x: int) -> int:\n    return 2 * x\n")
    for n in range(60):
        schedule = ', schedule="*/5 * * * *"' if n % 2 else ""
        (folder / f"dag_{n:03d}.py").write_text(NUMBERED.format(n=n, schedule=schedule, helper=helper))
    (folder / "dag_010_broken.py").write_text("import not_a_module_anywhere\n")
    (folder / "dag_020_syntax.py").write_text("def (:\n")
    (folder / "dag_030_exits.py").write_text("raise SystemExit(3)\n")
    (folder / "dag_040_dup.py").write_text(NUMBERED.format(n=7, schedule="", helper=helper))
    (folder / "dag_050_nothing.py").write_text("X = 1\n")


def _as_json(parsed: ParsedFolder) -> tuple[dict[str, Any], dict[str, tuple[str, str]], list[str]]:
    return {k: s.to_json() for k, s in parsed.structures.items()}, parsed.errors, parsed.files


@pytest.fixture
def helper_name() -> Iterator[str]:
    """A module name no other test imports; sys.path and sys.modules are restored afterwards
    (the test imports the folder in its own process too)."""
    name = f"helpers_{uuid.uuid4().hex[:8]}"
    path = list(sys.path)
    yield name
    sys.path[:] = path
    for module in [m for m in sys.modules if m == name or m.startswith(DAG_MODULE_PREFIX)]:
        del sys.modules[module]


def test_a_parallel_import_finds_what_one_process_importing_the_files_in_turn_finds(
    tmp_path: Path, helper_name: str
) -> None:
    _write_mixed_folder(tmp_path, helper_name)

    parallel = parse_folder(tmp_path, file_limit_s=30.0, processes=2)
    single = parse_folder(tmp_path, file_limit_s=30.0, processes=1)

    assert _as_json(parallel) == _as_json(single)
    assert list(parallel.structures) == list(single.structures)  # file order, both
    assert len(parallel.structures) == 60
    assert parallel.structures["numbered_005"].tasks["extract"].retry.retries == 2
    errors = {Path(f).name: message for f, (message, _) in parallel.errors.items()}
    assert sorted(errors) == ["dag_010_broken.py", "dag_020_syntax.py", "dag_030_exits.py", "dag_040_dup.py"]
    assert errors["dag_010_broken.py"].startswith("ModuleNotFoundError")
    assert errors["dag_040_dup.py"].startswith("DagDefinitionError: duplicate dag id 'numbered_007'")
    assert "dag_007.py" in errors["dag_040_dup.py"]
    assert parallel.errors[str(tmp_path / "dag_010_broken.py")][1]  # the traceback came along
    # What the loader finds importing the folder in this very process, one file after the other.
    loaded = load_folder(tmp_path)
    assert {k: d.structure().to_json() for k, d in loaded.dags.items()} == _as_json(parallel)[0]
    assert {f: (e.message, e.traceback) for f, e in loaded.errors.items()} == parallel.errors
    assert multiprocessing.active_children() == []


def test_files_that_hang_or_end_their_processor_in_a_parallel_import_are_load_errors(tmp_path: Path) -> None:
    for n in range(40):
        (tmp_path / f"dag_{n:03d}.py").write_text(GOOD.format(dag_id=f"good_{n:03d}"))
    (tmp_path / "dag_005_stuck.py").write_text(UNINTERRUPTIBLE)
    (tmp_path / "dag_015_exits.py").write_text("import os\nos._exit(7)\n")
    (tmp_path / "dag_025_sleeps.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "dag_035_stuck.py").write_text(UNINTERRUPTIBLE)

    parsed = parse_folder(tmp_path, file_limit_s=0.5, processes=2)

    assert sorted(parsed.structures) == [f"good_{n:03d}" for n in range(40)]
    assert len(parsed.files) == 44
    errors = {Path(f).name: message for f, (message, _) in parsed.errors.items()}
    assert sorted(errors) == ["dag_005_stuck.py", "dag_015_exits.py", "dag_025_sleeps.py", "dag_035_stuck.py"]
    for stuck in ("dag_005_stuck.py", "dag_035_stuck.py"):
        assert errors[stuck].startswith("DagImportTimeout") and "(the import was killed)" in errors[stuck]
    assert "exit code 7" in errors["dag_015_exits.py"]
    assert errors["dag_025_sleeps.py"].startswith("DagImportTimeout")
    assert "killed" not in errors["dag_025_sleeps.py"]  # the loader's own limit ended it
    assert {Path(f).name for f in parsed.timed_out} == {
        "dag_005_stuck.py",
        "dag_025_sleeps.py",
        "dag_035_stuck.py",
    }
    assert multiprocessing.active_children() == []


#: Starts a process of its own, notes its pid, and hangs where no signal reaches.
STUCK_WITH_A_CHILD = """
import pathlib, signal, subprocess
child = subprocess.Popen(["sleep", "600"])
pathlib.Path({pid_file!r}).write_text(str(child.pid))
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM}})
while True:
    pass
"""


def test_killing_a_stuck_processor_kills_what_its_file_started(tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    pid_file = tmp_path / "child.pid"
    (folder / "a_stuck.py").write_text(STUCK_WITH_A_CHILD.format(pid_file=str(pid_file)))
    (folder / "b_good.py").write_text(GOOD.format(dag_id="good"))

    parsed = parse_folder(folder, file_limit_s=0.5, processes=2)

    assert list(parsed.structures) == ["good"]
    assert str(folder / "a_stuck.py") in parsed.timed_out
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _running(pid):
        assert time.monotonic() < deadline, f"the stuck file's child {pid} outlived its processor"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """True while `pid` exists and is no zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_folder_gets_one_processor_per_core_and_at_most_one_per_share_of_files() -> None:
    cores = len(os.sched_getaffinity(0))
    assert processor_count(0) == 1
    assert processor_count(1) == 1
    assert processor_count(FILES_PER_PROCESSOR) == 1
    assert processor_count(FILES_PER_PROCESSOR + 1) == min(cores, 2)
    assert processor_count(10_000) == min(cores, 50)


def test_processors_write_no_bytecode_into_the_dag_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    for n in range(3):
        (tmp_path / f"dag_{n}.py").write_text(GOOD.format(dag_id=f"good_{n}"))

    parsed = parse_folder(tmp_path, file_limit_s=30.0, processes=2)

    assert sorted(parsed.structures) == ["good_0", "good_1", "good_2"]
    assert not (tmp_path / "__pycache__").exists()
