"""Command tasks' pure rules (allow-list, paths, trace id), their settings, and the capped log."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle.config import Settings
from treadle.domain.commands import attempt_log_path, output_folder, program_allowed, trace_id
from treadle.errors import ConfigError
from treadle.worker.attempt_log import AttemptLog

BASE = {"TREADLE_HOME": "/srv/treadle"}


@pytest.mark.parametrize(
    ("program", "resolved", "patterns", "allowed"),
    [
        ("java", "/usr/lib/jvm/java-17/bin/java", [], True),  # empty: anything
        ("java", "/usr/lib/jvm/java-17/bin/java", ["java"], True),
        ("java", "/usr/lib/jvm/java-17/bin/java", ["/usr/lib/jvm/*/bin/java"], True),
        ("java", "/usr/lib/jvm/java-17/bin/java", ["/usr/bin/java"], False),
        ("/usr/bin/python3.12", "/usr/bin/python3.12", ["python3*"], True),
        ("/bin/true", "/bin/true", ["python3*", "java"], False),
        ("./run.sh", "/srv/jobs/run.sh", ["/srv/jobs/*"], True),
        ("spark-submit", None, ["spark-*"], True),  # not found: matched by name, then refused as missing
    ],
)
def test_allow_list_patterns(program: str, resolved: str | None, patterns: list[str], allowed: bool) -> None:
    assert program_allowed(program, resolved, patterns) is allowed


def test_paths_of_an_attempt() -> None:
    logs = attempt_log_path(Path("/l"), dag_id="d", run_id="r", task_id="t", map_index=-1, attempt=2)
    assert logs == Path("/l/d/r/t/2.log")
    mapped = attempt_log_path(Path("/l"), dag_id="d", run_id="r", task_id="t", map_index=4, attempt=1)
    assert mapped == Path("/l/d/r/t.4/1.log")
    assert output_folder(Path("/runs"), run_id="r", task_id="t", map_index=-1, attempt=3) == Path(
        "/runs/r/outputs/t/3"
    )
    with pytest.raises(ValueError, match="cannot name a folder"):
        attempt_log_path(Path("/l"), dag_id="..", run_id="r", task_id="t", map_index=-1, attempt=1)


def test_trace_id_is_stable_per_run_and_differs_between_runs() -> None:
    assert trace_id("manual__1") == trace_id("manual__1")
    assert trace_id("manual__1") != trace_id("manual__2")
    assert len(trace_id("manual__1")) == 32 and int(trace_id("manual__1"), 16) >= 0


def test_settings_of_logs_and_commands() -> None:
    default = Settings.from_env(BASE)
    assert default.logs_dir == Path("/srv/treadle/logs")
    assert default.runs_dir == Path("/srv/treadle/runs")
    assert default.log_max_bytes == 200 * 1024 * 1024
    assert default.command_allowlist == ()
    custom = Settings.from_env(
        {
            **BASE,
            "TREADLE_LOGS_FOLDER": "/var/log/treadle",
            "TREADLE_LOG_MAX_BYTES": "1048576",
            "TREADLE_COMMAND_ALLOWLIST": "java, /opt/spark/bin/spark-submit,\npython3*",
        }
    )
    assert custom.logs_dir == Path("/var/log/treadle")
    assert custom.log_max_bytes == 1048576
    assert custom.command_allowlist == ("java", "/opt/spark/bin/spark-submit", "python3*")
    with pytest.raises(ConfigError, match="TREADLE_LOG_MAX_BYTES"):
        Settings.from_env({**BASE, "TREADLE_LOG_MAX_BYTES": "10"})


def test_the_log_stops_at_its_cap_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "a" / "1.log"
    log = AttemptLog(path, max_bytes=1024)
    for _ in range(100):
        log.write(b"x" * 100)
    log.close()
    data = path.read_bytes()
    assert data.startswith(b"x" * 1024)
    assert data.count(b"reached its limit of 1024 bytes") == 1
    assert len(data) < 1024 + 200
    assert log.truncated
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
