"""The DAG folder through the real CLI: bad files are reported one by one and never stop the good
ones; `treadle standalone` follows edits to DAG files while the CLI keeps reading."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

GOOD = """
    from __future__ import annotations

    from treadle import dag, task


    @task
    def hello() -> str:
        return "hello"


    @task
    def shout(word: str) -> str:
        return word.upper() + "!"


    @dag(dag_id="good")
    def good() -> None:
        shout(hello())
"""

#: file name -> (source, text its load error must contain)
BAD_FILES = {
    "import_error.py": (
        """
        import treadle_no_such_module_anywhere
        """,
        "ModuleNotFoundError: No module named 'treadle_no_such_module_anywhere'",
    ),
    "syntax_error.py": (
        """
        from treadle import dag, task

        def broken(:
            pass
        """,
        "SyntaxError",
    ),
    "cycle.py": (
        """
        from treadle import dag, task

        @task
        def a() -> None: ...

        @task
        def b() -> None: ...

        @task
        def c() -> None: ...

        @dag(dag_id="cyclic")
        def cyclic() -> None:
            x, y, z = a(), b(), c()
            x >> y >> z
            z >> x
        """,
        "dag 'cyclic' has a cycle: a -> b -> c -> a",
    ),
    "unknown_dependency.py": (
        """
        from treadle import dag, task

        @task(depends_on=["nowhere"])
        def lonely() -> None: ...

        @dag(dag_id="unknown_dependency")
        def unknown_dependency() -> None:
            lonely()
        """,
        "unknown task id 'nowhere'",
    ),
    "duplicate_task.py": (
        """
        from treadle import dag, task

        @task(task_id="same")
        def one() -> None: ...

        @task(task_id="same")
        def two() -> None: ...

        @dag(dag_id="duplicate_task")
        def duplicate_task() -> None:
            one()
            two()
        """,
        "duplicate task id 'same'",
    ),
    "bad_setting.py": (
        """
        from treadle import dag, task

        @task(retries=-1)
        def eager() -> None: ...

        @dag(dag_id="bad_setting")
        def bad_setting() -> None:
            eager()
        """,
        "retries must be an integer >= 0, got -1",
    ),
    # Sorts after good.py: the DAG id defined twice is an error on the later file.
    "later_duplicate_dag.py": (
        """
        from treadle import dag, task

        @task
        def other() -> None: ...

        @dag(dag_id="good")
        def good() -> None:
            other()
        """,
        "duplicate dag id 'good'",
    ),
}

FIXED_CYCLE = """
    from treadle import dag, task

    @task
    def a() -> int:
        return 1

    @task
    def b() -> int:
        return 2

    @dag(dag_id="cyclic")
    def cyclic() -> None:
        a() >> b()
"""


def test_bad_dag_files_are_reported_never_fatal(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(sqlite_url)
    c.write_dag("good.py", GOOD)
    for name, (source, _) in BAD_FILES.items():
        c.write_dag(name, source)

    sync = c.cli("dags", "sync")
    assert sync.returncode == 0, sync.stderr
    assert "synced 1 DAG(s)" in sync.stdout and f"{len(BAD_FILES)} file(s) with load errors" in sync.stdout

    errors = {e["fileloc"]: e for e in c.cli_json("dags", "errors")}
    assert set(errors) == {str(c.dags / name) for name in BAD_FILES}
    for name, (_, expected) in BAD_FILES.items():
        error = errors[str(c.dags / name)]
        assert expected in error["message"], (name, error["message"])
        assert error["traceback"] or name == "later_duplicate_dag.py"
    # The human table names every bad file too.
    table = c.cli("dags", "errors")
    assert table.returncode == 0
    assert all(name in table.stdout for name in BAD_FILES)

    dags = c.cli_json("dags", "list")
    assert [d["dag_id"] for d in dags] == ["good"]
    assert dags[0]["fileloc"] == str(c.dags / "good.py")

    c.start("standalone", "standalone", "--concurrency", "2")
    run_id = c.trigger("good")
    detail = c.wait_run(run_id, timeout=30)
    assert detail.run.state == "success"
    assert detail.results == {"hello": "hello", "shout": "HELLO!"}
    assert c.procs["standalone"].poll() is None

    # Fixing one file removes its error (and only its error) on the next sync.
    c.write_dag("cycle.py", FIXED_CYCLE)
    again = c.cli("dags", "sync")
    assert again.returncode == 0 and "synced 2 DAG(s)" in again.stdout
    remaining = {e["fileloc"] for e in c.cli_json("dags", "errors")}
    assert remaining == {str(c.dags / name) for name in BAD_FILES if name != "cycle.py"}
    assert [d["dag_id"] for d in c.cli_json("dags", "list")] == ["cyclic", "good"]
    fixed_run = c.trigger("cyclic")
    assert c.wait_run(fixed_run, timeout=30).results == {"a": 1, "b": 2}

    # Removing a bad file drops its error as well; an empty report reads as such.
    for name in BAD_FILES:
        (c.dags / name).unlink(missing_ok=True)
    assert c.cli("dags", "sync").returncode == 0
    assert c.cli_json("dags", "errors") == []
    assert "no DAG load errors" in c.cli("dags", "errors").stdout


EDITABLE_V1 = """
    from treadle import dag, task

    @task
    def first() -> int:
        return 1

    @dag(dag_id="editable")
    def editable() -> None:
        first()
"""

EDITABLE_V2 = """
    from treadle import dag, task

    @task
    def first() -> int:
        return 1

    @task
    def second(value: int) -> int:
        return value + 1

    @dag(dag_id="editable")
    def editable() -> None:
        second(first())
"""


def test_standalone_picks_up_an_edited_dag_file_while_cli_reads_work(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url, TREADLE_DAG_REFRESH_SECONDS="0.5")
    c.write_dag("editable.py", EDITABLE_V1)
    c.start("standalone", "standalone", "--concurrency", "2")

    def registered() -> list[dict[str, object]]:
        return [d for d in c.cli_json("dags", "list") if d["dag_id"] == "editable"]

    (v1,) = wait_for(registered, timeout=30, message="standalone to register the DAG")
    first_run = c.trigger("editable")
    assert c.wait_run(first_run, timeout=30).results == {"first": 1}

    c.write_dag("editable.py", EDITABLE_V2)
    (v2,) = wait_for(
        lambda: [d for d in registered() if d["version_hash"] != v1["version_hash"]],
        timeout=10,
        message="the edited DAG file to be registered",
    )
    assert v2["latest_version_id"] != v1["latest_version_id"]

    second_run = c.trigger("editable")
    detail = c.wait_run(second_run, timeout=30)
    assert detail.run.state == "success"
    assert detail.results == {"first": 1, "second": 2}
    # The first run stays pinned to the version it started with.
    assert [t.task_id for t in c.detail(first_run).task_instances] == ["first"]

    # Reads from other processes work while standalone owns the database.
    runs = c.cli_json("runs", "list")
    assert {r["run_id"]: r["state"] for r in runs} == {first_run: "success", second_run: "success"}
    shown = c.cli_json("runs", "show", second_run)
    assert shown["run"]["dag_version_id"] == v2["latest_version_id"]
    assert c.cli_json("dags", "errors") == []
    assert c.procs["standalone"].poll() is None


HANGING_FILES = {
    "spins.py": "while True:\n    pass\n",
    "sleeps.py": "import time\n\ntime.sleep(600)\n",
    # Blocks the loader's signal: only killing its processor ends this import.
    "stuck.py": (
        "import signal\n\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\nwhile True:\n    pass\n"
    ),
}


def test_dag_files_that_hang_at_import_are_load_errors_and_never_hold_up_the_good_ones(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url, TREADLE_DAG_IMPORT_TIMEOUT_SECONDS="1")
    c.write_dag("good.py", GOOD)
    for name, source in HANGING_FILES.items():
        (c.dags / name).write_text(source)

    synced = c.cli("dags", "sync")  # returns, with the hanging files as load errors
    assert synced.returncode == 0, synced.stderr
    assert "3 file(s) with load errors" in synced.stdout
    errors = {e["fileloc"].rsplit("/", 1)[1]: e["message"] for e in c.cli_json("dags", "errors")}
    assert set(errors) == set(HANGING_FILES)
    for message in errors.values():
        assert "longer than 1 s (TREADLE_DAG_IMPORT_TIMEOUT_SECONDS)" in message

    proc = c.start("standalone", "standalone", "--concurrency", "2")
    run_id = c.trigger("good")
    assert c.wait_run(run_id, timeout=90).results == {"hello": "hello", "shout": "HELLO!"}
    c.signal("standalone", signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
