"""Log formats and the ids they carry, the metrics hooks, and the observability settings."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from treadle.config import Settings
from treadle.errors import ConfigError
from treadle.observability.hooks import NO_HOOKS
from treadle.observability.logging import (
    JsonFormatter,
    ProcessFields,
    TextFormatter,
    attempt_context,
    resolve_format,
)
from treadle.observability.metrics import Metrics

BASE = {"TREADLE_HOME": "/tmp/treadle-home", "TREADLE_DATABASE_URL": "sqlite:////tmp/treadle-home/t.db"}


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO, ProcessFields]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    fields = ProcessFields()
    handler.addFilter(fields)
    logger = logging.getLogger(f"treadle.test.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream, fields


def test_json_lines_carry_the_attempt_and_worker_ids_only_inside_the_attempt() -> None:
    logger, stream, fields = _logger(JsonFormatter())
    fields.bind(worker_id="w-1")
    with attempt_context(run_id="r1", dag_id="d", task_id="t", map_index=2, attempt=3):
        logger.info("inside", extra={"event": "worker.thing"})
    logger.info("outside", extra={"event": "worker.other", "run_id": "explicit"})
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["event"] == "worker.thing" and inside["message"] == "inside"
    assert {k: inside[k] for k in ("run_id", "dag_id", "task_id", "map_index", "attempt", "worker_id")} == {
        "run_id": "r1",
        "dag_id": "d",
        "task_id": "t",
        "map_index": 2,
        "attempt": 3,
        "worker_id": "w-1",
    }
    assert outside["run_id"] == "explicit" and "task_id" not in outside and outside["worker_id"] == "w-1"


def test_attempt_ids_belong_to_the_thread_that_set_them() -> None:
    logger, stream, _ = _logger(JsonFormatter())
    inside = threading.Event()
    done = threading.Event()

    def slot() -> None:
        with attempt_context(run_id="r1", task_id="t"):
            inside.set()
            done.wait(5)

    thread = threading.Thread(target=slot)
    thread.start()
    assert inside.wait(5)
    logger.info("another thread", extra={"event": "worker.beat"})
    done.set()
    thread.join()
    assert "run_id" not in json.loads(stream.getvalue())


def test_text_lines_are_readable_and_coloured_only_when_asked() -> None:
    plain, stream, _ = _logger(TextFormatter(colour=False))
    plain.warning("held", extra={"event": "worker.outcome_held", "run_id": "r1"})
    line = stream.getvalue().strip()
    assert "WARNING" in line and "held" in line and "event=worker.outcome_held run_id=r1" in line
    assert "\033[" not in line
    coloured, stream, _ = _logger(TextFormatter(colour=True))
    coloured.error("boom", extra={"event": "x"})
    assert "\033[31m" in stream.getvalue()


def test_uvicorns_coloured_copy_of_its_message_is_no_field_of_a_line() -> None:
    """uvicorn logs `Started server process` with `color_message` (the same text with colour
    codes): neither format prints it."""
    for formatter in (TextFormatter(colour=False), JsonFormatter()):
        logger, stream, _ = _logger(formatter)
        logger.info("Started server process [%d]", 7, extra={"color_message": "Started \033[36m%d\033[0m"})
        line = stream.getvalue()
        assert "Started server process [7]" in line
        assert "color_message" not in line and "\033[36m" not in line and "\\u001b" not in line


def test_the_log_format_follows_the_setting_else_the_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_format(None, Tty()) == "text"
    assert resolve_format(None, io.StringIO()) == "json"
    assert resolve_format("json", Tty()) == "json"
    assert Settings.from_env({**BASE, "TREADLE_LOG_FORMAT": "TEXT"}).log_format == "text"


@pytest.mark.parametrize(
    ("variable", "raw", "words"),
    [
        ("TREADLE_LOG_FORMAT", "yaml", "TREADLE_LOG_FORMAT must be json or text, got 'yaml'"),
        ("TREADLE_METRICS_PORT", "0", "TREADLE_METRICS_PORT must be a TCP port in 1..65535, got '0'"),
        ("TREADLE_METRICS_PORT", "http", "TREADLE_METRICS_PORT must be a TCP port in 1..65535, got 'http'"),
        ("TREADLE_METRICS_PORT", "70000", "got '70000'"),
    ],
)
def test_bad_observability_settings_are_refused_by_name(variable: str, raw: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Settings.from_env({**BASE, variable: raw})


def test_metrics_are_off_by_default_and_the_port_is_read() -> None:
    assert Settings.from_env(BASE).metrics_port is None
    settings = Settings.from_env({**BASE, "TREADLE_METRICS_PORT": "9464", "TREADLE_METRICS_HOST": "0.0.0.0"})
    assert (settings.metrics_port, settings.metrics_host) == (9464, "0.0.0.0")


def test_hooks_move_the_series_they_name() -> None:
    metrics = Metrics()
    metrics.attempt_finished(dag_id="d", task_id="t", outcome="success", duration_s=0.2)
    metrics.attempt_finished(dag_id="d", task_id="t", outcome="failed", duration_s=1.5)
    metrics.attempt_retried(dag_id="d", task_id="t")
    metrics.attempt_dead_lettered(dag_id="d", task_id="t")
    metrics.attempt_needs_inspection(dag_id="d", task_id="u")
    metrics.leases_reaped(2)
    metrics.schedule_fired(delay_s=0.3)
    metrics.database_call(kind="read", duration_s=0.002)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics.exposition().decode())
        for s in f.samples
    }
    task = (("dag_id", "d"), ("task_id", "t"))
    assert samples[("treadle_task_outcomes_total", (*task[:1], ("outcome", "success"), task[1]))] == 1
    assert samples[("treadle_task_outcomes_total", (*task[:1], ("outcome", "failed"), task[1]))] == 1
    assert samples[("treadle_task_duration_seconds_count", task[:1])] == 2
    assert samples[("treadle_task_duration_seconds_sum", task[:1])] == pytest.approx(1.7)
    assert samples[("treadle_task_retries_total", task)] == 1
    assert samples[("treadle_dead_letters_total", task)] == 1
    assert samples[("treadle_needs_inspection_total", (("dag_id", "d"), ("task_id", "u")))] == 1
    assert samples[("treadle_lost_leases_total", ())] == 2
    assert samples[("treadle_cron_fire_delay_seconds_count", ())] == 1
    assert samples[("treadle_database_call_seconds_count", (("kind", "read"),))] == 1


def test_no_hooks_record_nothing_and_two_processes_never_share_a_registry() -> None:
    NO_HOOKS.attempt_finished(dag_id="d", task_id="t", outcome="success", duration_s=1)
    one, two = Metrics(), Metrics()
    one.leases_reaped(1)
    assert b"treadle_lost_leases_total 1.0" in one.exposition()
    assert b"treadle_lost_leases_total 0.0" in two.exposition()
    assert b"_created" not in one.exposition()
