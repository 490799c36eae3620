"""Alert rules (pure): validation with named errors, the spec syntax of TREADLE_ALERT_RULES, which
rules match (a DAG's kind replaces the deployment's), thresholds, the deduplication window and
backfill hold-back, the Slack body, and "published by" deadlines across daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from treadle import Alert, Dataset, config_file, dag, task
from treadle.config import Settings
from treadle.domain.alerts import (
    DEFAULT_SYSTEM_RULES,
    AlertKind,
    AlertRule,
    Disposition,
    Occurrence,
    disposition,
    parse_rules,
    rules_for,
    slack_body,
)
from treadle.domain.freshness import Deadline, Output, misses
from treadle.errors import ConfigError, DagDefinitionError

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)


def _occurrence(kind: AlertKind = AlertKind.DEAD_LETTER, **more: object) -> Occurrence:
    values: dict[str, object] = {
        "kind": kind,
        "key": "k",
        "dag_id": "d",
        "task_id": "t",
        "run_id": "r",
        "summary": "s",
        "next_action": "n",
    }
    values.update(more)
    return Occurrence(**values)  # type: ignore[arg-type]


def test_rules_are_validated_with_the_field_named() -> None:
    with pytest.raises(DagDefinitionError, match="kind must be one of dead_letter"):
        Alert("dead_leter")
    with pytest.raises(DagDefinitionError, match="needs a budget"):
        Alert("run_over_budget")
    with pytest.raises(DagDefinitionError, match="takes no tasks"):
        Alert("consecutive_failures", tasks=["t"])
    with pytest.raises(DagDefinitionError, match="count must be an integer"):
        Alert("repeated_retries", count=0)
    with pytest.raises(DagDefinitionError, match="severity must be one of"):
        Alert("dead_letter", severity="loud")
    assert Alert("run_over_budget", budget="2h").budget_s == 7200
    assert Alert("consecutive_failures").count == 3


def test_a_dag_rule_naming_a_missing_task_is_refused() -> None:
    @task(outlets=[Dataset("x.y")])
    def t() -> None:
        pass

    with pytest.raises(DagDefinitionError, match=r"names task.*'nope'"):

        @dag(dag_id="bad_alerts", alerts=[Alert("dead_letter", tasks=["nope"])])
        def bad_alerts() -> None:
            t()

    with pytest.raises(DagDefinitionError, match="published_by must be 'HH:MM"):

        @dag(dag_id="bad_deadline", published_by="6am")
        def bad_deadline() -> None:
            t()

    with pytest.raises(DagDefinitionError, match="unknown time zone 'Mars/Olympus'"):

        @dag(dag_id="bad_zone", published_by="06:00 Mars/Olympus")
        def bad_zone() -> None:
            t()


def test_the_rules_setting_syntax() -> None:
    rules = parse_rules(
        "dead_letter, consecutive_failures count=3 severity=critical, run_over_budget budget=2h"
    )
    assert [r.kind for r in rules] == [
        AlertKind.DEAD_LETTER,
        AlertKind.CONSECUTIVE_FAILURES,
        AlertKind.RUN_OVER_BUDGET,
    ]
    assert rules[1].severity == "critical" and rules[2].budget_s == 7200
    assert parse_rules("none") == ()
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        parse_rules("dead_letter colour=red")
    with pytest.raises(ValueError, match="'run_over_budget': alert run_over_budget needs a budget"):
        parse_rules("run_over_budget")
    assert parse_rules(rules[1].describe()) == (rules[1],)


def test_a_dags_own_rules_of_a_kind_replace_the_deployments_and_thresholds_apply() -> None:
    system = (AlertRule(kind=AlertKind.DEAD_LETTER), AlertRule(kind=AlertKind.REPEATED_RETRIES))
    own = (AlertRule(kind=AlertKind.DEAD_LETTER, tasks=("other",)),)
    assert rules_for(_occurrence(), dag_rules=own, system_rules=system, dag_id="d") == []
    ((rule_id, _),) = rules_for(_occurrence(), dag_rules=(), system_rules=system, dag_id="d")
    assert rule_id.startswith("system:dead_letter:")
    retried = _occurrence(AlertKind.REPEATED_RETRIES, measure=2)
    assert rules_for(retried, dag_rules=(), system_rules=system, dag_id="d") == []  # 2 < 3
    three = _occurrence(AlertKind.REPEATED_RETRIES, measure=3)
    assert len(rules_for(three, dag_rules=(), system_rules=system, dag_id="d")) == 1


def test_repeats_within_the_window_and_backfill_runs_are_not_sent() -> None:
    rule = AlertRule(kind=AlertKind.DEAD_LETTER, dedup_s=600)
    occurrence = _occurrence()
    assert disposition(rule, occurrence, last_sent_at=None, now=NOW, default_dedup_s=0) is Disposition.SENT
    recent = NOW - timedelta(seconds=599)
    assert (
        disposition(rule, occurrence, last_sent_at=recent, now=NOW, default_dedup_s=0)
        is Disposition.DUPLICATE
    )
    old = NOW - timedelta(seconds=600)
    assert disposition(rule, occurrence, last_sent_at=old, now=NOW, default_dedup_s=0) is Disposition.SENT
    backfill = _occurrence(is_backfill=True)
    assert disposition(rule, backfill, last_sent_at=None, now=NOW, default_dedup_s=0) is Disposition.BACKFILL
    asked = AlertRule(kind=AlertKind.DEAD_LETTER, backfills=True)
    assert disposition(asked, backfill, last_sent_at=None, now=NOW, default_dedup_s=0) is Disposition.SENT


def test_the_slack_body_escapes_and_links() -> None:
    body = slack_body(
        {
            "severity": "error",
            "summary": "x <failed> & more",
            "pipeline": "p",
            "run_id": "r1",
            "task_id": "t",
            "map_index": 3,
            "next_action": "do <this>",
            "ui_url": "https://ui/runs/r1",
            "runbook_url": "https://rb",
        }
    )
    assert body["text"].startswith(":x: [ERROR] x <failed>")
    fields = str(body["blocks"][1])
    assert "t[3]" in fields and "r1" in fields
    assert "do &lt;this&gt;" in str(body["blocks"][2])
    assert (
        body["blocks"][3]["elements"][0]["text"]
        == "<https://ui/runs/r1|Open in treadle> · <https://rb|Runbook>"
    )


def test_a_deadline_is_the_wall_clock_time_in_its_zone_across_dst() -> None:
    berlin = Deadline.parse("06:00 Europe/Berlin")
    # The night of 29 March 2026 is 23 hours long in Berlin: the deadlines stay at 06:00 local.
    before = berlin.on(datetime(2026, 3, 28).date())
    after = berlin.on(datetime(2026, 3, 29).date())
    assert before.astimezone(UTC).hour == 5 and after.astimezone(UTC).hour == 4
    assert after.astimezone(UTC) - before.astimezone(UTC) == timedelta(hours=23)
    assert berlin.latest_at_or_before(after) == after
    assert berlin.latest_at_or_before(after - timedelta(seconds=1)) == before
    assert berlin.next_after(after) == berlin.on(datetime(2026, 3, 30).date())
    assert str(Deadline.parse("6:05")) == "06:05 UTC"


def test_a_deadline_miss_is_once_per_period() -> None:
    jakarta = Deadline.parse("06:00 Asia/Jakarta")  # 23:00 UTC the day before
    published = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)  # 05:00 in Jakarta on 2 December: in time
    output = Output(dag_id="d", dataset="x", slo_s=None, last_event_at=published, deadline=jakarta)
    # 05:00 on the 3rd: the 2 December deadline was met, the 3 December one is still ahead.
    assert misses([output], now=datetime(2026, 12, 2, 22, 0, tzinfo=UTC)) == []
    # 06:30 on the 3rd: nothing new since the 2 December deadline.
    (missed,) = misses([output], now=datetime(2026, 12, 2, 23, 30, tzinfo=UTC))
    assert missed.deadline_at == "2026-12-03T06:00:00+07:00"
    (same,) = misses([output], now=datetime(2026, 12, 3, 20, 0, tzinfo=UTC))
    assert same.key == missed.key  # one alert per missed period
    (next_day,) = misses([output], now=datetime(2026, 12, 3, 23, 30, tzinfo=UTC))
    assert next_day.key != missed.key


def test_the_deployments_rules_from_treadle_toml(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "treadle.toml").write_text(
        'alert_rules = ["dead_letter severity=critical", "run_over_budget budget=2h"]\n'
        "alert_dedup_seconds = 60\n"
        'ui_base_url = "https://treadle.example"\n'
        'alert_slack_url = "https://hooks.slack.example/T1"\n'
    )
    settings = Settings.from_env(config_file.load({"TREADLE_HOME": str(home)}).env)
    alerting = settings.alerting
    assert [r.describe() for r in alerting.rules] == [
        "dead_letter severity=critical",
        "run_over_budget budget=7200s",
    ]
    assert alerting.dedup_s == 60 and alerting.ui_base_url == "https://treadle.example"
    assert settings.outbox_sinks == ("slack",)
    assert alerting.ui_url(dag_id="d", run_id="r 1", task_id="t", map_index=2) == (
        "https://treadle.example/runs/r%201/tasks/t?map_index=2"
    )
    assert Settings.from_env({}).alerting.rules == DEFAULT_SYSTEM_RULES
    with pytest.raises(ConfigError, match="TREADLE_ALERT_RULES: 'dead_letter loud': option 'loud'"):
        Settings.from_env({"TREADLE_ALERT_RULES": "dead_letter loud"})


def test_a_datasets_own_slo_is_declared_where_the_dag_lists_its_outputs() -> None:
    with pytest.raises(DagDefinitionError, match=r"dataset 'x\.y': freshness_slo"):
        Dataset("x.y", freshness_slo="soon")
    with pytest.raises(DagDefinitionError, match="unknown time zone"):
        Dataset("x.y", published_by="06:00 Nowhere/City")
    with pytest.raises(
        DagDefinitionError, match=r"declare it where the DAG lists its outputs: @dag\(outlets="
    ):

        @task(outlets=[Dataset("x.y", freshness_slo="6h")])
        def writes() -> None:
            pass

        @dag(dag_id="slo_on_a_task")
        def slo_on_a_task() -> None:
            writes()

    @task(outlets=[Dataset("x.y")])
    def plain() -> None:
        pass

    @dag(dag_id="own_slo", outlets=[Dataset("x.y", freshness_slo="6h", published_by="06:00 Asia/Jakarta")])
    def own_slo() -> None:
        plain()

    contract = own_slo.structure().contract
    assert contract.slos_of("x.y") == (6 * 3600, Deadline.parse("06:00 Asia/Jakarta"))
    assert contract.to_json()["dataset_slos"] == [
        {"dataset": "x.y", "freshness_slo_s": 21600.0, "published_by": "06:00 Asia/Jakarta"}
    ]
    assert type(contract).from_json(contract.to_json()) == contract
