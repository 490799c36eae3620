"""What `treadle dags show` prints: a DAG's structure, contract, schedule, params and latest runs,
as text for people (every time says its zone) or as one JSON object."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from treadle.cli.render import table, to_jsonable
from treadle.domain.dag_version import DagStructure, TaskDef
from treadle.domain.graph import topological_order
from treadle.domain.records import RunInfo
from treadle.domain.secret_params import MASK, is_secret
from treadle.engine.dag_detail import DagDetail, OutputFreshness
from treadle.engine.schedules import Slot, in_words, seconds_in_words, upcoming

#: Next fire times shown.
NEXT_FIRES = 5


def utc(value: datetime | None) -> str:
    """A time in UTC, saying so."""
    return "-" if value is None else value.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%d %H:%M:%S UTC")


def local(value: datetime, zone: ZoneInfo) -> str:
    """A time in a DAG's zone, with the zone's abbreviation or offset."""
    return value.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def next_fires(detail: DagDetail) -> list[Slot]:
    """The schedule's next fire times after the database's now (none for manual or dataset DAGs)."""
    spec = detail.version.structure.schedule
    if spec is None or not spec.is_timed:
        return []
    return upcoming(spec, after=detail.now, count=NEXT_FIRES)


def ordered_tasks(structure: DagStructure) -> list[TaskDef]:
    """The tasks, each after its upstreams."""
    return [structure.tasks[t] for t in topological_order(structure.upstream_map())]


def run_duration_s(run: RunInfo, now: datetime) -> float | None:
    """How long a run took, or has been running."""
    if run.started_at is None:
        return None
    return ((run.ended_at or now) - run.started_at).total_seconds()


def as_json(detail: DagDetail, *, default_timeout_s: float | None) -> dict[str, Any]:
    """The whole view as one JSON object."""
    s = detail.version.structure
    zone = ZoneInfo(s.schedule.timezone if s.schedule else "UTC")
    view: dict[str, Any] = to_jsonable(
        {
            "dag_id": s.dag_id,
            "owner": s.owner,
            "description": s.description,
            "tags": sorted(s.tags),
            "paused": detail.dag.is_paused,
            "fileloc": s.fileloc,
            "version_hash": detail.version.version_hash,
            "max_active_tasks": s.max_active_tasks,
            "contract": {
                **_contract_fields(s),
                "inputs": list(s.inputs()),
                "outputs": [_output_json(o) for o in detail.outputs],
            },
            "schedule": {
                "spec": s.schedule.to_json() if s.schedule else None,
                "description": in_words(s.schedule),
                "timezone": zone.key,
                "last_fire_at": detail.last_fire_at,
                "next_fire_at": detail.next_fire_at,
                "next_fires": [
                    {
                        "fire_at": f.fire_at,
                        "fire_at_local": f.fire_at.astimezone(zone),
                        "logical_date": f.logical_date,
                        "data_interval_start": f.data_interval_start,
                        "data_interval_end": f.data_interval_end,
                    }
                    for f in next_fires(detail)
                ],
            },
            "tasks": [_task_json(t, default_timeout_s) for t in ordered_tasks(s)],
            "params": {
                "schema": s.params_schema,
                "rules": [{**r.to_json(), "description": r.describe()} for r in s.param_rules],
            },
            "runs": [
                {
                    "run_id": r.run_id,
                    "run_type": r.run_type,
                    "state": r.state,
                    "logical_date": r.logical_date,
                    "started_at": r.started_at,
                    "ended_at": r.ended_at,
                    "duration_s": run_duration_s(r, detail.now),
                    "triggered_by": r.triggered_by,
                }
                for r in detail.runs
            ],
            "now": detail.now,
        }
    )
    return view


def _contract_fields(s: DagStructure) -> dict[str, Any]:
    c = s.contract
    return {
        "purpose": c.purpose,
        "criticality": c.criticality.value if c.criticality else None,
        "declared_inlets": list(c.inlets),
        "declared_outlets": list(c.outlets),
        "freshness_slo_s": c.freshness_slo_s,
        "published_by": c.published_by,
        "alerts": [r.to_json() for r in c.alerts],
        "failure_impact": c.failure_impact,
        "runbook_url": c.runbook_url,
        "manual_runs": c.manual_runs,
        "backfills": c.backfills,
    }


def _output_json(o: OutputFreshness) -> dict[str, Any]:
    return {"name": o.name, "last_event_at": o.last_event_at, "age_s": o.age_s, "within_slo": o.within_slo}


def _task_json(t: TaskDef, default_timeout_s: float | None) -> dict[str, Any]:
    data = t.to_json()
    # Arguments are shown by `treadle tasks test`; here the structure and settings matter.
    data.pop("args", None)
    data.pop("kwargs", None)
    own = t.timeout_s is not None
    data["effective_timeout_s"] = t.timeout_s if own else default_timeout_s
    data["timeout_is_default"] = not own
    return data


def print_text(detail: DagDetail, *, default_timeout_s: float | None) -> None:
    """Every section, for people."""
    s = detail.version.structure
    _print_header(detail)
    _print_contract(detail)
    _print_schedule(detail)
    _print_tasks(s, default_timeout_s)
    _print_params(s)
    _print_runs(detail)


def _print_header(detail: DagDetail) -> None:
    s = detail.version.structure
    click.echo(f"DAG {s.dag_id}{'  (PAUSED)' if detail.dag.is_paused else ''}")
    for label, value in (
        ("description", s.description),
        ("owner", s.owner),
        ("tags", ", ".join(sorted(s.tags))),
        ("file", s.fileloc),
        ("version", detail.version.version_hash[:12]),
        ("max active tasks", s.max_active_tasks),
    ):
        if value not in ("", None):
            click.echo(f"  {label + ':':<18}{value}")


def _print_contract(detail: DagDetail) -> None:
    s = detail.version.structure
    c = s.contract
    rows: list[tuple[str, object]] = [
        ("purpose", c.purpose or "-"),
        ("criticality", c.criticality.value if c.criticality else "-"),
        ("inputs", ", ".join(s.inputs()) or "-"),
        ("freshness SLO", seconds_in_words(c.freshness_slo_s) if c.freshness_slo_s else "-"),
        ("published by", c.published_by or "-"),
        ("alerts", "; ".join(r.describe() for r in c.alerts) or "- (the deployment's TREADLE_ALERT_RULES)"),
        ("failure impact", c.failure_impact or "-"),
        ("runbook", c.runbook_url or "-"),
        ("manual runs", "allowed" if c.manual_runs else "refused (manual_runs=False)"),
        ("backfills", "allowed" if c.backfills else "refused (backfills=False)"),
    ]
    table("contract", ["field", "value"], rows)
    if detail.outputs:
        table(
            "outputs",
            ["dataset", "newest event", "age", "freshness"],
            [
                (
                    o.name,
                    utc(o.last_event_at),
                    "-" if o.age_s is None else seconds_in_words(round(o.age_s)),
                    _freshness_text(o),
                )
                for o in detail.outputs
            ],
        )


def _freshness_text(o: OutputFreshness) -> str:
    if o.within_slo is None:
        return "-"
    if o.last_event_at is None:
        return "STALE (no event yet)"
    return "within SLO" if o.within_slo else "STALE"


def _print_schedule(detail: DagDetail) -> None:
    s = detail.version.structure
    click.echo(f"schedule: {in_words(s.schedule)}")
    if s.schedule is not None and s.schedule.is_timed:
        click.echo(f"  last fired: {utc(detail.last_fire_at)}; next due: {utc(detail.next_fire_at)}")
    fires = next_fires(detail)
    if not fires:
        return
    zone = ZoneInfo(s.schedule.timezone if s.schedule else "UTC")
    table(
        f"next fire times ({zone.key})",
        ["fire (local)", "fire (UTC)", "data interval (local)"],
        [
            (
                local(f.fire_at, zone),
                utc(f.fire_at),
                f"{local(f.data_interval_start, zone)} -> {local(f.data_interval_end, zone)}",
            )
            for f in fires
        ],
    )


def _print_tasks(s: DagStructure, default_timeout_s: float | None) -> None:
    tasks = ordered_tasks(s)
    rules = {t.task_id: t.to_json().get("trigger_rule") for t in tasks}
    has_rules = any(rules.values())
    columns = ["task", "upstream", "queue", "pool", "retries", "timeout"]
    rows = []
    for t in tasks:
        if t.timeout_s is not None:
            timeout = seconds_in_words(t.timeout_s)
        elif default_timeout_s is not None:
            timeout = f"{seconds_in_words(default_timeout_s)} (default)"
        else:
            timeout = "none"
        pool = f"{t.pool} x{t.pool_slots}" if t.pool else "-"
        row = [t.task_id, ", ".join(t.upstream) or "-", t.queue, pool, t.retry.retries, timeout]
        rows.append([*row, rules[t.task_id] or "-"] if has_rules else row)
    table("tasks (upstreams first)", [*columns, "trigger rule"] if has_rules else columns, rows)


def _print_params(s: DagStructure) -> None:
    schema = s.params_schema
    if schema is None:
        click.echo("params: none declared (any conf is taken as the params)")
    else:
        required = set(schema.get("required") or ())
        table(
            "params",
            ["name", "type", "default", "required", "description"],
            [
                (
                    name,
                    _type_text(prop),
                    _default_text(prop),
                    "yes" if name in required else "no",
                    prop.get("description", ""),
                )
                for name, prop in sorted((schema.get("properties") or {}).items())
            ],
        )
    for rule in s.param_rules:
        click.echo(f"  rule: {rule.describe()}")


def _type_text(prop: dict[str, Any]) -> str:
    kind = prop.get("type", "any")
    return " | ".join(kind) if isinstance(kind, list) else str(kind)


def _default_text(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return "-"
    return MASK if is_secret(prop) else json.dumps(prop["default"])


def _print_runs(detail: DagDetail) -> None:
    if not detail.runs:
        click.echo("no runs yet")
        return
    table(
        f"latest runs (times in UTC; now {utc(detail.now)})",
        ["run id", "type", "state", "logical date", "started", "duration"],
        [
            (
                r.run_id,
                r.run_type,
                r.state,
                utc(r.logical_date),
                utc(r.started_at),
                _duration_text(r, detail.now),
            )
            for r in detail.runs
        ],
    )


def _duration_text(run: RunInfo, now: datetime) -> str:
    seconds = run_duration_s(run, now)
    if seconds is None:
        return "-"
    text = f"{seconds:.1f} s" if seconds < 120 else seconds_in_words(round(seconds))
    return text if run.ended_at is not None else f"{text} so far"
