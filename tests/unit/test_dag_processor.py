"""The DAG processor: a folder parsed in processes of its own, each file within a time limit."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_loader import GOOD
from treadle.worker.dag_processor import parse_folder

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
