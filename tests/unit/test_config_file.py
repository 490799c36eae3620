"""treadle.toml: every TREADLE_* setting in a file, the environment overriding it, unknown keys
refused by name, and `treadle config show` naming each value's source without secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from treadle import config_file
from treadle.api.settings import ApiSettings
from treadle.cli.main import cli
from treadle.config import Settings
from treadle.errors import ConfigError

SECRET = "s3cr3t-value-that-is-long-enough-1234567890"


def _home(tmp_path: Path, text: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "treadle.toml").write_text(text)
    return {"TREADLE_HOME": str(home)}


def test_the_file_sets_what_the_environment_does_not_and_the_environment_wins(tmp_path: Path) -> None:
    environ = _home(
        tmp_path,
        'lease_seconds = 40\nheartbeat_seconds = 4\ndags_folder = "/srv/dags"\n'
        'command_allowlist = ["/bin/echo", "python*"]\napi_behind_tls = true\n',
    )
    environ["TREADLE_HEARTBEAT_SECONDS"] = "2"
    layered = config_file.load(environ)
    settings = Settings.from_env(layered.env)

    assert (settings.lease_s, settings.heartbeat_s) == (40.0, 2.0)
    assert settings.dags_folder == Path("/srv/dags")
    assert settings.command_allowlist == ("/bin/echo", "python*")
    assert ApiSettings.from_env(layered.env).behind_tls is True
    sources = {v: layered.source(v, environ) for v in ("TREADLE_LEASE_SECONDS", "TREADLE_HEARTBEAT_SECONDS")}
    assert sources == {"TREADLE_LEASE_SECONDS": "file", "TREADLE_HEARTBEAT_SECONDS": "env"}
    assert layered.source("TREADLE_RETENTION_DAYS", environ) == "default"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("lease_secs = 40\n", "unknown setting 'lease_secs'; known settings: admin_password,"),
        ('home = "/x"\n', "'home' cannot be set in the file"),
        (
            "lease_seconds = [1, 2]\n",
            "lease_seconds must be a string, a number, a boolean or a list of strings",
        ),
        ("lease_seconds = \n", "is not valid TOML"),
    ],
)
def test_a_bad_file_is_a_config_error_naming_the_file_and_key(
    tmp_path: Path, text: str, problem: str
) -> None:
    environ = _home(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config_file.load(environ)
    assert str(tmp_path / "home" / "treadle.toml") in str(info.value)
    assert problem in str(info.value)


def test_a_value_out_of_range_in_the_file_gets_the_variables_message(tmp_path: Path) -> None:
    environ = _home(tmp_path, "lease_seconds = 0\n")
    with pytest.raises(ConfigError, match="TREADLE_LEASE_SECONDS"):
        Settings.from_env(config_file.load(environ).env)


def test_config_show_names_sources_and_never_prints_a_secret(tmp_path: Path) -> None:
    named = tmp_path / "elsewhere.toml"
    named.write_text(
        f'secret_key = "{SECRET}"\nretention_days = 7\n'
        'database_url = "postgresql://treadle:hunter2@db.example:5432/treadle"\n'
    )
    # TREADLE_CONFIG listed so that the runner restores it: --config sets it for child processes.
    env = {"TREADLE_HOME": str(tmp_path / "home"), "TREADLE_RETENTION_DAYS": "9", "TREADLE_CONFIG": None}
    done = CliRunner().invoke(cli, ["--config", str(named), "config", "show", "--json"], env=env)

    assert done.exit_code == 0, done.output
    assert SECRET not in done.output and "hunter2" not in done.output
    shown = json.loads(done.output)
    rows = {r["variable"]: (r["value"], r["source"]) for r in shown["settings"]}
    assert shown["file"] == str(named)
    assert rows["TREADLE_SECRET_KEY"] == ("(set, not shown)", "file")
    assert rows["TREADLE_ADMIN_PASSWORD"] == ("(not set)", "default")
    assert rows["TREADLE_RETENTION_DAYS"] == ("9.0", "env")
    assert rows["TREADLE_DATABASE_URL"] == ("postgresql://treadle:***@db.example:5432/treadle", "file")
    assert rows["TREADLE_LEASE_SECONDS"] == ("30.0", "default")
    assert {r["variable"] for r in shown["settings"]} == {"TREADLE_HOME", *config_file.VARIABLES}


def test_a_missing_config_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    env = {"TREADLE_HOME": str(tmp_path), "TREADLE_CONFIG": None}
    done = CliRunner().invoke(cli, ["--config", str(missing), "config", "show"], env=env)
    assert done.exit_code == 2
    assert f"error: settings file {missing} (--config / TREADLE_CONFIG) does not exist" in done.output


def test_config_leaves_the_test_process_environment_alone() -> None:
    import os

    assert os.environ.get("TREADLE_CONFIG") is None, os.environ.get("TREADLE_CONFIG")
