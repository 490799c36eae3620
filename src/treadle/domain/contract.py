"""A DAG's contract: what it is for, how much its failure matters, what it reads and writes, how
fresh its outputs must be, where its runbook is, and which kinds of runs it accepts (pure).

Stored in the DAG version's structure; only what differs from the defaults is serialized, so the
version hash of a DAG that declares no contract does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from treadle.domain.alerts import AlertRule
from treadle.domain.freshness import DatasetSlo, Deadline
from treadle.domain.identifiers import is_dataset_name

#: Longest text of a free-text contract field (purpose, failure impact).
MAX_TEXT_CHARS = 2_000
#: Longest runbook URL.
MAX_URL_CHARS = 2_000
#: Longest freshness SLO: a year.
MAX_FRESHNESS_S = 366 * 86_400


class Criticality(StrEnum):
    """How much a DAG's failure matters to the business, lowest first."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True, kw_only=True)
class DagContract:
    """What a DAG promises and allows, beyond its tasks (every field optional)."""

    #: Why the DAG exists, in a sentence or two.
    purpose: str = ""
    #: None: not declared.
    criticality: Criticality | None = None
    #: Datasets the DAG reads, as declared on the DAG (a dataset schedule adds its own).
    inlets: tuple[str, ...] = ()
    #: Datasets the DAG writes, as declared on the DAG (its tasks' outlets add their own).
    outlets: tuple[str, ...] = ()
    #: The DAG's outputs should never be older than this many seconds (None: no objective).
    freshness_slo_s: float | None = None
    #: Who or what suffers when the DAG fails, in plain words.
    failure_impact: str = ""
    #: An http(s) URL operators open when the DAG fails.
    runbook_url: str | None = None
    #: Whether `treadle dags trigger` (and any other manual trigger) may start a run.
    manual_runs: bool = True
    #: Whether a backfill may run past intervals of it.
    backfills: bool = True
    #: Each day, its outputs should have a new version by this deadline ("06:00 Asia/Jakarta").
    published_by: str | None = None
    #: Its alert rules (domain/alerts.py); a kind declared here replaces the deployment's.
    alerts: tuple[AlertRule, ...] = ()
    #: SLOs its outputs declare themselves (`Dataset(..., freshness_slo=, published_by=)`).
    dataset_slos: tuple[DatasetSlo, ...] = ()

    def __post_init__(self) -> None:
        """Validate every field; ValueError names the field and what it must be."""
        for name in ("purpose", "failure_impact"):
            _check_text(name, getattr(self, name))
        if self.criticality is not None:
            object.__setattr__(self, "criticality", _criticality(self.criticality))
        for name in ("inlets", "outlets"):
            object.__setattr__(self, name, _dataset_names(name, getattr(self, name)))
        if self.freshness_slo_s is not None:
            object.__setattr__(self, "freshness_slo_s", _freshness(self.freshness_slo_s))
        if self.runbook_url is not None:
            _check_url(self.runbook_url)
        for name in ("manual_runs", "backfills"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self._check_freshness_and_alerts()

    def _check_freshness_and_alerts(self) -> None:
        if self.published_by is not None:
            if not isinstance(self.published_by, str):
                raise ValueError(
                    f"published_by must be text such as '06:00 Asia/Jakarta', got {self.published_by!r}"
                )
            object.__setattr__(self, "published_by", str(Deadline.parse(self.published_by)))
        if isinstance(self.alerts, AlertRule) or not isinstance(self.alerts, tuple | list):
            raise ValueError(f"alerts must be a list of Alert(...) rules, got {self.alerts!r}")
        for rule in self.alerts:
            if not isinstance(rule, AlertRule):
                raise ValueError(f"alerts must hold Alert(...) rules, got {rule!r}")
        object.__setattr__(self, "alerts", tuple(self.alerts))
        if not all(isinstance(d, DatasetSlo) for d in self.dataset_slos):
            raise ValueError(f"dataset_slos must hold DatasetSlo objects, got {self.dataset_slos!r}")
        object.__setattr__(self, "dataset_slos", tuple(self.dataset_slos))

    @property
    def deadline(self) -> Deadline | None:
        """The "published by" deadline, parsed."""
        return None if self.published_by is None else Deadline.parse(self.published_by)

    @property
    def has_freshness_slo(self) -> bool:
        """True when the DAG or one of its outputs declares a freshness SLO."""
        return self.freshness_slo_s is not None or self.published_by is not None or bool(self.dataset_slos)

    def slos_of(self, dataset: str) -> tuple[float | None, Deadline | None]:
        """The maximum age and the deadline that apply to one output: its own, else the DAG's."""
        for own in self.dataset_slos:
            if own.dataset == dataset:
                deadline = None if own.published_by is None else Deadline.parse(own.published_by)
                return own.freshness_slo_s, deadline
        return self.freshness_slo_s, self.deadline

    def to_json(self) -> dict[str, Any]:
        """The JSON form: only the fields that differ from their defaults."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.name in ("alerts", "dataset_slos"):
                out[f.name] = [item.to_json() for item in value]
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        if self.criticality is not None:
            out["criticality"] = self.criticality.value
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> DagContract:
        """Build from the JSON form (missing keys take their defaults)."""
        known = {f.name for f in fields(DagContract)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("inlets", "outlets"):
            if name in values:
                values[name] = tuple(values[name])
        if "alerts" in values:
            values["alerts"] = tuple(AlertRule.from_json(r) for r in values["alerts"])
        if "dataset_slos" in values:
            values["dataset_slos"] = tuple(DatasetSlo(**d) for d in values["dataset_slos"])
        return DagContract(**values)

    @property
    def is_default(self) -> bool:
        """True when nothing is declared (the contract is not serialized at all)."""
        return not self.to_json()


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, got {type(value).__name__}")
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{name} must be at most {MAX_TEXT_CHARS} characters, got {len(value)}")


def _criticality(value: object) -> Criticality:
    allowed = ", ".join(c.value for c in Criticality)
    if not isinstance(value, str):
        raise ValueError(f"criticality must be one of {allowed}, got {value!r}")
    try:
        return Criticality(value.strip().lower())
    except ValueError:
        raise ValueError(f"criticality must be one of {allowed}, got {value!r}") from None


def _dataset_names(field: str, values: object) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, tuple | list):
        raise ValueError(f"{field} must be a list of dataset names, got {values!r}")
    for v in values:
        if not isinstance(v, str) or not is_dataset_name(v):
            raise ValueError(f"{field}: dataset name {v!r} must be 1-500 URI characters without spaces")
    return tuple(sorted(set(values)))


def _freshness(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"freshness_slo must be a duration, got {value!r}")
    seconds = float(value)
    if not 0 < seconds <= MAX_FRESHNESS_S:
        raise ValueError(f"freshness_slo must be more than 0 s and at most 366 days, got {seconds:g} s")
    return seconds


def _check_url(value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"runbook_url must be an http(s) URL, got {value!r}")
    if len(value) > MAX_URL_CHARS or any(c.isspace() for c in value):
        raise ValueError(f"runbook_url must be an http(s) URL without spaces, got {value[:200]!r}")
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not host:
        raise ValueError(f"runbook_url must be an http(s) URL with a host, got {value!r}")
