"""Settings from the environment: every numeric setting finite and in range, URLs by exact scheme."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from treadle.config import NUMERIC_SETTINGS, NumericSetting, Settings
from treadle.errors import ConfigError, SettingOutOfRange

BASE = {"TREADLE_HOME": "/tmp/treadle-home", "TREADLE_DATABASE_URL": "sqlite:////tmp/treadle-home/t.db"}


def _refusal(**env: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({**BASE, **env})
    return info.value


def test_defaults_are_valid() -> None:
    settings = Settings.from_env(BASE)
    assert (settings.lease_s, settings.heartbeat_s, settings.max_clock_skew_s) == (30.0, 5.0, 2.0)


@pytest.mark.parametrize("spec", NUMERIC_SETTINGS, ids=lambda s: s.variable)
@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_non_finite_values_are_refused_naming_variable_value_and_range(
    spec: NumericSetting, raw: str
) -> None:
    variable = spec.variable
    error = _refusal(**{variable: raw})
    assert isinstance(error, SettingOutOfRange)
    assert error.setting == variable
    text = str(error)
    assert text.startswith(f"{variable} must be ")
    assert re.search(r"in [\d.]+\.\.[\d.]+", text), text
    assert text.endswith(f"got {float(raw)}")


@pytest.mark.parametrize(
    ("variable", "raw", "allowed"),
    [
        ("TREADLE_LEASE_SECONDS", "0.5", "1..3600"),
        ("TREADLE_LEASE_SECONDS", "3601", "1..3600"),
        ("TREADLE_HEARTBEAT_SECONDS", "0.01", "0.1..1200"),
        ("TREADLE_SCHEDULER_TICK_SECONDS", "1e-9", "0.05..60"),
        ("TREADLE_SCHEDULER_TICK_SECONDS", "61", "0.05..60"),
        ("TREADLE_DAG_REFRESH_SECONDS", "0.05", "0.1..3600"),
        ("TREADLE_MAX_RESULT_BYTES", "0", "1..16777216"),
        ("TREADLE_MAX_RESULT_BYTES", "16777217", "1..16777216"),
        ("TREADLE_QUEUE_TIMEOUT_SECONDS", "2592001", "1..2592000"),
        ("TREADLE_RETENTION_DAYS", "-1", "0..36500"),
        ("TREADLE_RETENTION_DAYS", "36501", "0..36500"),
        ("TREADLE_SHUTDOWN_GRACE_SECONDS", "-0.1", "0..3600"),
        ("TREADLE_SCHEDULER_LEASE_SECONDS", "601", "1..600"),
        ("TREADLE_MAX_CLOCK_SKEW_SECONDS", "0.001", "0.01..600"),
        ("TREADLE_BACKFILL_MAX_SPAN_DAYS", "0", "1..36500"),
    ],
)
def test_values_out_of_range_are_refused(variable: str, raw: str, allowed: str) -> None:
    error = _refusal(**{variable: raw})
    assert isinstance(error, SettingOutOfRange)
    assert f"{variable} must be " in str(error)
    assert allowed in str(error)
    assert f"got {float(raw)}" in str(error)


#: Values that keep the rules between settings out of the way of either end of any one range.
ROOM = {
    "TREADLE_LEASE_SECONDS": "3600",
    "TREADLE_HEARTBEAT_SECONDS": "0.1",
    "TREADLE_SCHEDULER_LEASE_SECONDS": "600",
    "TREADLE_MAX_CLOCK_SKEW_SECONDS": "0.5",
}


@pytest.mark.parametrize("spec", NUMERIC_SETTINGS, ids=lambda s: s.variable)
def test_both_ends_of_every_range_are_accepted(spec: NumericSetting) -> None:
    for value in (spec.low, spec.high):
        env = {**BASE, **ROOM, spec.variable: repr(value)}
        if spec.variable == "TREADLE_MAX_CLOCK_SKEW_SECONDS" and value == 600:
            # In range, but the scheduler lease is at most 600 too and the skew must stay below it.
            with pytest.raises(ConfigError, match="must be below TREADLE_SCHEDULER_LEASE_SECONDS"):
                Settings.from_env(env)
            continue
        assert getattr(Settings.from_env(env), spec.field) == value


def test_byte_limits_must_be_whole_numbers() -> None:
    error = _refusal(TREADLE_MAX_RESULT_BYTES="1.5")
    assert "TREADLE_MAX_RESULT_BYTES must be a whole number of bytes in 1..16777216 (16 MiB)" in str(error)
    settings = Settings.from_env({**BASE, "TREADLE_MAX_RESULT_BYTES": "1e3"})
    assert settings.max_result_bytes == 1000
    assert isinstance(settings.max_result_bytes, int)


def test_text_that_is_not_a_number_is_refused() -> None:
    error = _refusal(TREADLE_LEASE_SECONDS="thirty")
    assert str(error) == "TREADLE_LEASE_SECONDS must be a finite number of seconds in 1..3600, got 'thirty'"


def test_an_empty_variable_means_the_default() -> None:
    assert Settings.from_env({**BASE, "TREADLE_LEASE_SECONDS": ""}).lease_s == 30.0


def test_lease_must_be_three_heartbeats() -> None:
    error = _refusal(TREADLE_LEASE_SECONDS="10", TREADLE_HEARTBEAT_SECONDS="4")
    assert "TREADLE_LEASE_SECONDS (10.0) must be at least 3 x TREADLE_HEARTBEAT_SECONDS (4.0)" in str(error)


def test_clock_skew_must_be_below_the_scheduler_lease() -> None:
    error = _refusal(TREADLE_SCHEDULER_LEASE_SECONDS="5", TREADLE_MAX_CLOCK_SKEW_SECONDS="5")
    assert "TREADLE_MAX_CLOCK_SKEW_SECONDS (5.0) must be below TREADLE_SCHEDULER_LEASE_SECONDS (5.0)" in str(
        error
    )


def test_the_audit_log_is_kept_at_least_as_long_as_the_history() -> None:
    error = _refusal(TREADLE_RETENTION_DAYS="90", TREADLE_AUDIT_RETENTION_DAYS="30")
    assert "TREADLE_AUDIT_RETENTION_DAYS (30.0) must be 0" in str(error)
    assert "at least TREADLE_RETENTION_DAYS (90.0)" in str(error)
    kept = Settings.from_env({**BASE, "TREADLE_RETENTION_DAYS": "90"})
    assert kept.audit_retention_days == 0  # default: the whole audit log is kept
    longer = Settings.from_env(
        {**BASE, "TREADLE_RETENTION_DAYS": "90", "TREADLE_AUDIT_RETENTION_DAYS": "400"}
    )
    assert longer.audit_retention_days == 400


def test_admission_limits_are_off_by_default_and_read_as_whole_numbers() -> None:
    assert Settings.from_env(BASE).admission_limits.is_off
    limits = Settings.from_env(
        {**BASE, "TREADLE_MAX_QUEUED_PER_QUEUE": "500", "TREADLE_MAX_QUEUED_PER_DAG": "50"}
    ).admission_limits
    assert (limits.per_queue, limits.per_dag, limits.is_off) == (500, 50, False)
    assert "whole number" in str(_refusal(TREADLE_MAX_QUEUED_PER_DAG="2.5"))


def test_default_clock_skew_follows_a_short_scheduler_lease() -> None:
    assert Settings.from_env({**BASE, "TREADLE_SCHEDULER_LEASE_SECONDS": "2"}).max_clock_skew_s == 1.0
    assert Settings.from_env({**BASE, "TREADLE_SCHEDULER_LEASE_SECONDS": "60"}).max_clock_skew_s == 2.0


def test_validate_checks_settings_built_directly() -> None:
    settings = Settings(
        home=Path("/h"), database_url="sqlite:////h/t.db", dags_folder=Path("/d"), lease_s=float("inf")
    )
    with pytest.raises(SettingOutOfRange, match=r"TREADLE_LEASE_SECONDS must be .* got inf"):
        settings.validate()


@pytest.mark.parametrize("url", ["postgresqlx://h/db", "mysqlx://h/db", "http://h/db", "sqlite+foo:///x.db"])
def test_database_url_schemes_are_matched_exactly(url: str) -> None:
    error = _refusal(TREADLE_DATABASE_URL=url)
    scheme = url.split("://")[0]
    assert f"TREADLE_DATABASE_URL has unsupported scheme {scheme}://" in str(error)
    assert "supported: sqlite:///PATH, postgresql://, postgres://, postgresql+psycopg://" in str(error)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("", 86_400.0),  # unset: a day
        ("3600", 3600.0),
        ("90m", 5400.0),
        ("12h", 43_200.0),
        (" 2D ", 172_800.0),
        ("0", None),
        ("none", None),
        ("OFF", None),
    ],
)
def test_default_task_timeout_takes_seconds_durations_or_off(raw: str, seconds: float | None) -> None:
    settings = Settings.from_env({**BASE, "TREADLE_DEFAULT_TASK_TIMEOUT": raw})
    assert settings.default_task_timeout_s == seconds


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("soon", "TREADLE_DEFAULT_TASK_TIMEOUT must be a number of seconds, a positive whole number"),
        ("-5", "TREADLE_DEFAULT_TASK_TIMEOUT must be a finite number of seconds in 1..31622400"),
        ("nan", "got nan"),
        ("0.5", "0, none or off: no default timeout"),
        ("400d", "in 1..31622400 (366 days"),
    ],
)
def test_a_bad_default_task_timeout_is_refused_naming_the_variable(raw: str, message: str) -> None:
    assert message in str(_refusal(TREADLE_DEFAULT_TASK_TIMEOUT=raw))


def test_validate_checks_a_default_task_timeout_set_directly() -> None:
    settings = Settings(
        home=Path("/h"), database_url="sqlite:////h/t.db", dags_folder=Path("/d"), default_task_timeout_s=0
    )
    with pytest.raises(SettingOutOfRange, match="TREADLE_DEFAULT_TASK_TIMEOUT"):
        settings.validate()
