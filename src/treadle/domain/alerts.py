"""Declarative alert rules: what they match, whether an occurrence is sent, deduplicated or
held back (a backfill's), and the alert's generic JSON and Slack-compatible forms.

Pure: the engine reads occurrences (a dead letter, a run over its budget ...) and the rules of
the DAG and of the deployment, this decides and formats.

Rules come from two places: a DAG's `@dag(alerts=[AlertRule(...)])` and the deployment's
TREADLE_ALERT_RULES (treadle.toml `alert_rules`). A DAG that declares rules of a kind replaces
the deployment's rules of that kind for itself; other kinds keep the deployment's. Without any
setting, the deployment's rules are `dead_letter` and `freshness_miss` (what treadle alerted
on before rules existed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from treadle.domain.durations import parse_duration
from treadle.errors import InvalidRequest


class AlertKind(StrEnum):
    """What an alert is about."""

    DEAD_LETTER = "dead_letter"
    NEEDS_INSPECTION = "needs_inspection"
    QUALITY_GATE_FAILED = "quality_gate_failed"
    FRESHNESS_MISS = "freshness_miss"
    CONSECUTIVE_FAILURES = "consecutive_failures"
    RUN_OVER_BUDGET = "run_over_budget"
    REPEATED_RETRIES = "repeated_retries"
    SENSOR_TIMEOUT = "sensor_timeout"
    BACKFILL_OVER_BUDGET = "backfill_over_budget"


class Severity(StrEnum):
    """How urgent an alert is, lowest first."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


DEFAULT_SEVERITY = {
    AlertKind.DEAD_LETTER: Severity.ERROR,
    AlertKind.NEEDS_INSPECTION: Severity.ERROR,
    AlertKind.QUALITY_GATE_FAILED: Severity.ERROR,
    AlertKind.FRESHNESS_MISS: Severity.WARNING,
    AlertKind.CONSECUTIVE_FAILURES: Severity.ERROR,
    AlertKind.RUN_OVER_BUDGET: Severity.WARNING,
    AlertKind.REPEATED_RETRIES: Severity.WARNING,
    AlertKind.SENSOR_TIMEOUT: Severity.ERROR,
    AlertKind.BACKFILL_OVER_BUDGET: Severity.WARNING,
}
#: Kinds whose rule needs `count` (with its default) or `budget_s` (no default).
COUNTED = {AlertKind.CONSECUTIVE_FAILURES: 3, AlertKind.REPEATED_RETRIES: 3}
BUDGETED = frozenset({AlertKind.RUN_OVER_BUDGET, AlertKind.BACKFILL_OVER_BUDGET})
#: Kinds about a task (a rule may name tasks); the others are about a run, a DAG or a dataset.
TASK_KINDS = frozenset(
    {
        AlertKind.DEAD_LETTER,
        AlertKind.NEEDS_INSPECTION,
        AlertKind.QUALITY_GATE_FAILED,
        AlertKind.REPEATED_RETRIES,
        AlertKind.SENSOR_TIMEOUT,
    }
)
#: Repeats of one rule about one subject within this many seconds are not sent again.
DEFAULT_DEDUP_S = 3600.0
MAX_COUNT = 1000
MAX_BUDGET_S = 366 * 86_400


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRule:
    """Alert on `kind`: for the tasks named (empty: all), at `severity` (None: the kind's own).

    `count`: consecutive failed runs (consecutive_failures) or retries of one task instance
    (repeated_retries) that make an alert. `budget_s`: how long a run (run_over_budget) or a
    backfill (backfill_over_budget) may take. `dedup_s`: repeats about the same subject within
    it are recorded, not sent (None: the deployment's window). `backfills`: also alert about
    backfill runs (held back otherwise).
    """

    kind: AlertKind
    tasks: tuple[str, ...] = ()
    severity: Severity | None = None
    count: int | None = None
    budget_s: float | None = None
    dedup_s: float | None = None
    backfills: bool = False

    def __post_init__(self) -> None:
        """Validate; ValueError names the field and what it must be."""
        object.__setattr__(self, "kind", _enum(AlertKind, self.kind, "kind"))
        if self.severity is not None:
            object.__setattr__(self, "severity", _enum(Severity, self.severity, "severity"))
        if isinstance(self.tasks, str) or not all(isinstance(t, str) and t for t in self.tasks):
            raise ValueError(f"alert {self.kind}: tasks must be a list of task ids, got {self.tasks!r}")
        if self.tasks and self.kind not in TASK_KINDS:
            raise ValueError(f"alert {self.kind} is about a run or a DAG; it takes no tasks")
        object.__setattr__(self, "tasks", tuple(sorted(set(self.tasks))))
        self._check_count()
        self._check_budget()
        if self.dedup_s is not None and not (
            isinstance(self.dedup_s, int | float) and 0 <= self.dedup_s <= MAX_BUDGET_S
        ):
            raise ValueError(f"alert {self.kind}: dedup must be 0 s to 366 days, got {self.dedup_s!r}")
        if not isinstance(self.backfills, bool):
            raise ValueError(f"alert {self.kind}: backfills must be True or False, got {self.backfills!r}")

    def _check_count(self) -> None:
        if self.kind not in COUNTED:
            if self.count is not None:
                raise ValueError(f"alert {self.kind} takes no count")
            return
        if self.count is None:
            object.__setattr__(self, "count", COUNTED[self.kind])
        elif (
            isinstance(self.count, bool)
            or not isinstance(self.count, int)
            or not 1 <= self.count <= MAX_COUNT
        ):
            raise ValueError(
                f"alert {self.kind}: count must be an integer 1..{MAX_COUNT}, got {self.count!r}"
            )

    def _check_budget(self) -> None:
        if self.kind not in BUDGETED:
            if self.budget_s is not None:
                raise ValueError(f"alert {self.kind} takes no budget")
            return
        if self.budget_s is None:
            raise ValueError(f"alert {self.kind} needs a budget (how long is too long, e.g. budget='2h')")
        if isinstance(self.budget_s, bool) or not isinstance(self.budget_s, int | float):
            raise ValueError(f"alert {self.kind}: budget must be a duration, got {self.budget_s!r}")
        if not 0 < self.budget_s <= MAX_BUDGET_S:
            raise ValueError(f"alert {self.kind}: budget must be more than 0 s and at most 366 days")
        object.__setattr__(self, "budget_s", float(self.budget_s))

    @property
    def effective_severity(self) -> Severity:
        """The severity alerts of this rule carry."""
        return self.severity or DEFAULT_SEVERITY[self.kind]

    def to_json(self) -> dict[str, Any]:
        """The stored form: the kind and what differs from the defaults."""
        out: dict[str, Any] = {"kind": self.kind.value}
        if self.tasks:
            out["tasks"] = list(self.tasks)
        if self.severity is not None:
            out["severity"] = self.severity.value
        for name in ("count", "budget_s", "dedup_s"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.backfills:
            out["backfills"] = True
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> AlertRule:
        """Build from the stored form."""
        values = dict(data)
        if "tasks" in values:
            values["tasks"] = tuple(values["tasks"])
        return AlertRule(**values)

    def rule_id(self, scope: str) -> str:
        """The identity of this rule in `scope` ("system" or "dag:<id>"): repeats are counted
        per rule id and subject."""
        return (
            f"{scope}:{self.kind.value}:"
            + hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]
        )

    def describe(self) -> str:
        """The rule in words, as TREADLE_ALERT_RULES spells it."""
        parts = [self.kind.value]
        if self.tasks:
            parts.append("tasks=" + "|".join(self.tasks))
        if self.severity is not None:
            parts.append(f"severity={self.severity.value}")
        if self.count is not None:
            parts.append(f"count={self.count}")
        if self.budget_s is not None:
            parts.append(f"budget={self.budget_s:g}s")
        if self.dedup_s is not None:
            parts.append(f"dedup={self.dedup_s:g}s")
        if self.backfills:
            parts.append("backfills=true")
        return " ".join(parts)


def _enum(cls: Any, value: object, name: str) -> Any:  # Any: an enum class and its member
    allowed = ", ".join(m.value for m in cls)
    try:
        return cls(str(value).strip().lower())
    except ValueError:
        raise ValueError(f"alert {name} must be one of {allowed}, got {value!r}") from None


#: The deployment's rules when TREADLE_ALERT_RULES is not set.
DEFAULT_SYSTEM_RULES = (AlertRule(kind=AlertKind.DEAD_LETTER), AlertRule(kind=AlertKind.FRESHNESS_MISS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Occurrence:
    """Something that happened that rules may alert on; `key` identifies it (one alert per rule)."""

    kind: AlertKind
    key: str
    dag_id: str
    summary: str
    next_action: str
    task_id: str | None = None
    run_id: str | None = None
    map_index: int = -1
    #: What else identifies the subject (a dataset, a backfill id).
    subject_detail: str | None = None
    is_backfill: bool = False
    #: What a rule's threshold is compared with: retries or failed runs in a row (its `count`),
    #: seconds taken (its `budget_s`).
    measure: float = 0.0
    #: The kind's own facts, kept in the payload (reason, message, attempt, age ...).
    facts: dict[str, Any] = field(default_factory=dict)  # Any: JSON

    @property
    def subject(self) -> str:
        """What repeats are about: the DAG, and the task or the detail when there is one."""
        parts = [self.dag_id, self.task_id or "", self.subject_detail or ""]
        return "/".join(parts).rstrip("/")


def rules_for(
    occurrence: Occurrence, *, dag_rules: Sequence[AlertRule], system_rules: Sequence[AlertRule], dag_id: str
) -> list[tuple[str, AlertRule]]:
    """The (rule id, rule) pairs that alert on `occurrence`: the DAG's rules of its kind if it
    declares any, else the deployment's; a rule naming tasks matches only those."""
    own = [r for r in dag_rules if r.kind is occurrence.kind]
    scoped = [(f"dag:{dag_id}", r) for r in own] if own else [("system", r) for r in system_rules]
    return [
        (rule.rule_id(scope), rule)
        for scope, rule in scoped
        if rule.kind is occurrence.kind
        and (not rule.tasks or occurrence.task_id in rule.tasks)
        and _over_threshold(rule, occurrence.measure)
    ]


def _over_threshold(rule: AlertRule, measure: float) -> bool:
    if rule.count is not None and measure < rule.count:
        return False
    return rule.budget_s is None or measure > rule.budget_s


def rules_of_kind(
    kind: AlertKind, *, dag_rules: Sequence[AlertRule], system_rules: Sequence[AlertRule]
) -> list[AlertRule]:
    """The rules of `kind` that apply to a DAG: its own if it declares any, else the deployment's."""
    own = [r for r in dag_rules if r.kind is kind]
    return own or [r for r in system_rules if r.kind is kind]


class Disposition(StrEnum):
    """What becomes of one rule's alert about one occurrence."""

    SENT = "sent"
    #: The same rule alerted about the same subject within its window.
    DUPLICATE = "duplicate"
    #: About a backfill run, and the rule does not ask for those.
    BACKFILL = "backfill"


def disposition(
    rule: AlertRule,
    occurrence: Occurrence,
    *,
    last_sent_at: datetime | None,
    now: datetime,
    default_dedup_s: float,
) -> Disposition:
    """Send, or record as a duplicate or a held-back backfill alert."""
    if occurrence.is_backfill and not rule.backfills:
        return Disposition.BACKFILL
    window = rule.dedup_s if rule.dedup_s is not None else default_dedup_s
    if last_sent_at is not None and (now - last_sent_at).total_seconds() < window:
        return Disposition.DUPLICATE
    return Disposition.SENT


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What the DAG's contract and the deployment add to an alert."""

    owner: str | None = None
    impact: str = ""
    criticality: str | None = None
    runbook_url: str | None = None
    ui_url: str | None = None


def alert_payload(
    rule_id: str, rule: AlertRule, occurrence: Occurrence, context: Context, *, at: datetime
) -> dict[str, Any]:  # Any: JSON
    """The generic JSON alert (the outbox payload; the Slack body is made from it)."""
    return {
        **occurrence.facts,
        "alert": occurrence.kind.value,
        "rule": rule_id,
        "severity": rule.effective_severity.value,
        "summary": occurrence.summary,
        "pipeline": occurrence.dag_id,
        "dag_id": occurrence.dag_id,
        "task_id": occurrence.task_id,
        "map_index": occurrence.map_index,
        "run_id": occurrence.run_id,
        "subject": occurrence.subject,
        "impact": context.impact or None,
        "criticality": context.criticality,
        "owner": context.owner,
        "runbook_url": context.runbook_url,
        "ui_url": context.ui_url,
        "next_action": occurrence.next_action,
        "at": at.isoformat(),
    }


_EMOJI = {
    "info": ":information_source:",
    "warning": ":warning:",
    "error": ":x:",
    "critical": ":rotating_light:",
}


def slack_body(payload: dict[str, Any]) -> dict[str, Any]:  # Any: JSON
    """A Slack-compatible message (`text` for notifications, `blocks` for the message) of an alert."""
    severity = str(payload.get("severity") or "error")
    title = (
        f"{_EMOJI.get(severity, '')} [{severity.upper()}] {payload.get('summary') or payload.get('alert')}"
    )
    fields = [
        ("Pipeline", payload.get("pipeline")),
        ("Run", payload.get("run_id")),
        ("Task", _task_text(payload)),
        ("Owner", payload.get("owner")),
        ("Impact", payload.get("impact")),
        ("Alert", payload.get("alert")),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title.strip()[:150]}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*{name}*\n{_escape(str(value))}"[:2000]}
                for name, value in fields
                if value not in (None, "")
            ],
        },
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": f"*Next action*\n{_escape(str(payload.get('next_action') or '-'))}"[:3000],
            },
        },
    ]
    links = [
        f"<{u}|{name}>"
        for name, u in (("Open in treadle", payload.get("ui_url")), ("Runbook", payload.get("runbook_url")))
        if u
    ]
    if links:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(links)}]})
    return {"text": title.strip(), "blocks": blocks}


def _task_text(payload: dict[str, Any]) -> str | None:
    task = payload.get("task_id")
    if not task:
        return None
    index = payload.get("map_index")
    return f"{task}[{index}]" if isinstance(index, int) and index >= 0 else str(task)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def parse_rules(text: str, *, name: str = "TREADLE_ALERT_RULES") -> tuple[AlertRule, ...]:
    """TREADLE_ALERT_RULES: rules separated by commas (a list in treadle.toml), each a kind and
    `key=value` options separated by spaces: "dead_letter, consecutive_failures count=3
    severity=critical, run_over_budget budget=2h". "none" turns every system-wide rule off."""
    stripped = text.strip()
    if stripped.lower() == "none":
        return ()
    rules = []
    for spec in (s.strip() for s in stripped.split(",")):
        if not spec:
            continue
        kind, *options = spec.split()
        values: dict[str, Any] = {"kind": kind}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or not value:
                raise ValueError(f"{name}: {spec!r}: option {option!r} must be key=value")
            values.update(_option(key, value, f"{name}: {spec!r}"))
        try:
            rules.append(AlertRule(**values))
        except ValueError as exc:
            raise ValueError(f"{name}: {spec!r}: {exc}") from None
    return tuple(rules)


def _option(key: str, value: str, where: str) -> dict[str, Any]:
    """One `key=value` of a rule spec as AlertRule's field."""
    if key == "count":
        if not value.isdigit():
            raise ValueError(f"{where}: count must be a whole number, got {value!r}")
        return {"count": int(value)}
    if key in ("budget", "dedup"):
        return {f"{key}_s": duration_s(value, f"{where}: {key}")}
    if key == "severity":
        return {"severity": value}
    if key == "tasks":
        return {"tasks": tuple(t for t in value.split("|") if t)}
    if key == "backfills":
        if value.lower() not in ("true", "false"):
            raise ValueError(f"{where}: backfills must be true or false, got {value!r}")
        return {"backfills": value.lower() == "true"}
    raise ValueError(
        f"{where}: unknown option {key!r} (options: tasks, severity, count, budget, dedup, backfills)"
    )


def duration_s(value: object, what: str) -> float:
    """Seconds of a duration given as a timedelta, seconds, or text such as "2h"; ValueError
    naming `what` otherwise."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        if value.strip() == "0" or value.strip() == "0s":
            return 0.0
        try:
            return parse_duration(value).total_seconds()
        except InvalidRequest as exc:
            raise ValueError(f"{what}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"{what} must be a duration (timedelta, seconds or text such as '2h'), got {value!r}"
        )
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerting:
    """The deployment's side of alerting (TREADLE_ALERT_*, TREADLE_UI_BASE_URL)."""

    rules: tuple[AlertRule, ...] = DEFAULT_SYSTEM_RULES
    dedup_s: float = DEFAULT_DEDUP_S
    #: Seconds between the leader's checks of lasting states and freshness.
    check_s: float = 30.0
    #: The web UI's address; alerts link to the run (or the DAG) there. None: no link.
    ui_base_url: str | None = None

    def ui_url(self, *, dag_id: str, run_id: str | None, task_id: str | None, map_index: int) -> str | None:
        """The page of the run (its task's, when there is one), else the DAG's."""
        if self.ui_base_url is None:
            return None
        base = self.ui_base_url.rstrip("/")
        if run_id is None:
            return f"{base}/dags/{quote(dag_id, safe='')}"
        url = f"{base}/runs/{quote(run_id, safe='')}"
        if task_id is None:
            return url
        url += f"/tasks/{quote(task_id, safe='')}"
        return url + (f"?map_index={map_index}" if map_index >= 0 else "")
