"""Layer rules that keep the design honest: a pure domain, SQL only in the store, a frozen API."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import treadle

SRC = Path(treadle.__file__).parent


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A file parsed once for all the rules below (they only read the tree)."""
    return ast.parse(path.read_text())


def _imports(path: Path, *, top_level: bool = False) -> set[str]:
    """The modules a file imports; `top_level`: only those imported when it is imported (not
    inside functions, not for type checking)."""
    names: set[str] = set()
    for node in _tree(path).body if top_level else ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_domain_imports_no_io_and_no_other_layer() -> None:
    allowed_prefixes = ("treadle.domain", "treadle.errors")
    for path in (SRC / "domain").glob("*.py"):
        for name in _imports(path):
            if name.startswith("treadle"):
                assert name.startswith(allowed_prefixes), f"{path.name} imports {name}"
            assert not name.startswith(("sqlalchemy", "psycopg", "click")), f"{path.name}: {name}"


def test_domain_reads_no_clock() -> None:
    for path in (SRC / "domain").glob("*.py"):
        text = path.read_text()
        for forbidden in ("datetime.now", "time.time", "time.monotonic", "date.today"):
            assert forbidden not in text, f"{path.name} reads the clock ({forbidden})"


def test_only_the_store_imports_sqlalchemy_or_psycopg() -> None:
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("store/", "bench/")):  # bench/ measures from outside, as a client
            continue
        for name in _imports(path):
            assert not name.startswith(("sqlalchemy", "psycopg")) or name == "sqlalchemy.engine", (
                f"{rel} imports {name}"
            )


def test_only_the_api_and_web_ui_import_the_web_extra_at_import() -> None:
    """The core (scheduler, worker, CLI) runs without the `web` extra: outside api/ and web/, its
    modules are imported only inside the functions that need them, after `extras.require_web`."""
    from treadle.extras import WEB_MODULES

    web = (*WEB_MODULES, "starlette")
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("api/", "web/")):
            continue
        for name in _imports(path, top_level=True):
            assert name.split(".")[0] not in web, f"{rel} imports {name} at import"


def test_scheduler_never_imports_user_code_loader() -> None:
    for path in (SRC / "scheduler").glob("*.py"):
        assert not any("loader" in n or "authoring" in n for n in _imports(path)), path.name


def test_public_api_is_frozen() -> None:
    assert sorted(treadle.__all__) == [
        "Alert",
        "Check",
        "CommandTask",
        "Dag",
        "Dataset",
        "Deferred",
        "ExitContract",
        "NonRetryable",
        "Param",
        "ParamRule",
        "PollResult",
        "Ready",
        "Retryable",
        "TaskContext",
        "TaskOutput",
        "UnknownCommit",
        "Waiting",
        "dag",
        "quality_gate",
        "sensor",
        "task",
    ]


@functools.cache
def _call_lines(path: Path) -> dict[str, list[int]]:
    """Function or method name -> lines where `path` calls it (one walk of the tree per file)."""
    lines: defaultdict[str, list[int]] = defaultdict(list)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            for name in {getattr(node.func, "attr", None), getattr(node.func, "id", None)} - {None}:
                lines[str(name)].append(node.lineno)
    return dict(lines)


def _calls(path: Path, name: str) -> list[int]:
    """Lines where `path` calls a function or method named `name`."""
    return _call_lines(path).get(name, [])


def test_run_states_are_written_only_by_the_run_protocol() -> None:
    """Every run transition goes through engine/runs.py (close, reopen, cancel): the one place
    that follows the run open/close protocol."""
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel in ("engine/runs.py", "store/runs.py"):
            continue
        assert not _calls(path, "set_run_state"), f"{rel} writes a run state outside engine/runs.py"
        # engine/mapping.py locks the run row (after its instance writes) only to serialize the
        # release of held-back mapped instances under max_active_mapped; it writes no run state.
        assert not _calls(path, "lock_run_state") or rel in ("engine/cancellation.py", "engine/mapping.py"), (
            f"{rel} locks a run row outside the protocol"
        )


def test_dialect_branches_live_in_store_dialects() -> None:
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel in ("store/dialects.py", "store/database.py", "store/tables.py") or "migrations" in rel:
            continue
        text = path.read_text()
        for branch in ("dialect.name", ".dialect ==", "dialect == "):
            assert branch not in text, f"{rel} branches on the dialect ({branch}); use store/dialects.py"


def test_api_never_imports_user_code_the_worker_or_the_scheduler() -> None:
    for path in [*(SRC / "api").rglob("*.py"), *(SRC / "web").rglob("*.py")]:
        for name in _imports(path):
            assert not any(
                word in name for word in ("loader", "authoring", "treadle.worker", "treadle.scheduler")
            ), (
                path,
                name,
            )


def test_the_api_process_loads_no_dag_loader_or_worker_module() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, treadle.api.app, treadle.cli.api, treadle.web.app; "
        "bad = [m for m in sys.modules if m.startswith(('treadle.authoring.loader', 'treadle.worker', "
        "'treadle.scheduler'))]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
