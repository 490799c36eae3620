"""`treadle datasets`: datasets (assets), the tasks that produce them and the DAGs they schedule."""

from __future__ import annotations

import json

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_time, table
from treadle.engine import datasets
from treadle.engine.accounts import Caller
from treadle.engine.dag_detail import DatasetFreshness, dataset_freshness
from treadle.engine.dataset_access import (
    grant_dataset,
    list_dataset_access,
    revoke_dataset,
    set_dataset_owner,
)
from treadle.engine.schedules import seconds_in_words

#: Characters of an event's metadata shown in a table cell (`--json` shows all of it).
EXTRA_PREVIEW_CHARS = 80


@cli.group("datasets")
def datasets_group() -> None:
    """Datasets: events recorded by tasks with `outlets=`, consumed by DAGs with `schedule=[Dataset]`."""


@datasets_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, as_json: bool) -> None:
    """List datasets: events, the last one, producing tasks and consuming DAGs."""
    found = datasets.list_datasets(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        "Datasets",
        ["dataset", "events", "last event", "last event at", "producers", "consumers"],
        [
            (
                d.name,
                d.events,
                d.last_event_id,
                fmt_time(d.last_event_at),
                ", ".join(d.producers) or None,
                ", ".join(f"{c} (paused)" if c in d.paused_consumers else c for c in d.consumers) or None,
            )
            for d in found
        ],
    )


@datasets_group.command("freshness")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def freshness_cmd(ctx: Context, as_json: bool) -> None:
    """Each output of a DAG with a freshness SLO: its age against the maximum age, and whether
    the latest "published by" deadline saw a new version."""
    now, found = dataset_freshness(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        f"Freshness at {fmt_time(now)}",
        ["dataset", "DAG", "owner", "last event at", "age", "max age", "published by", "status"],
        [
            (
                f.dataset,
                f.dag_id,
                f.owner,
                fmt_time(f.last_event_at),
                None if f.age_s is None else seconds_in_words(round(f.age_s)),
                None if f.slo_s is None else seconds_in_words(round(f.slo_s)),
                _deadline_text(f),
                _status(f),
            )
            for f in found
        ],
    )


def _deadline_text(f: DatasetFreshness) -> str | None:
    """The deadline, the latest one passed and the next."""
    if f.published_by is None:
        return None
    return f"{f.published_by} (last {fmt_time(f.deadline_at)}, next {fmt_time(f.next_deadline_at)})"


def _status(f: DatasetFreshness) -> str:
    if f.age_s is None:
        return "never published"
    if f.met_deadline is False:
        return "LATE (no version by the last deadline)"
    return "fresh" if f.within_slo else "STALE"


@datasets_group.command("events")
@click.argument("name")
@click.option("--limit", default=50, show_default=True, help="How many of the newest events.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def events_cmd(ctx: Context, name: str, limit: int, as_json: bool) -> None:
    """Show the newest events of dataset NAME, newest first."""
    found = datasets.dataset_events(ctx.db, name, limit=limit)
    if as_json:
        emit_json(found)
        return
    rows = []
    for e in found:
        extra = json.dumps(e.extra, sort_keys=True) if e.extra else None
        if extra is not None and len(extra) > EXTRA_PREVIEW_CHARS:
            extra = extra[: EXTRA_PREVIEW_CHARS - 1] + "…"
        task = f"{e.dag_id}.{e.task_id}" if e.dag_id else None
        rows.append((e.id, fmt_time(e.created_at), e.run_id, task, e.version, extra))
    table(f"Events of {name}", ["id", "time", "run", "task", "version", "extra"], rows)


@datasets_group.command("owner")
@click.argument("name")
@click.argument("team")
@pass_context
def owner_cmd(ctx: Context, name: str, team: str) -> None:
    """Make TEAM the owner of dataset NAME: its DAGs (and granted teams') may emit to it."""
    previous = set_dataset_owner(ctx.db, name, team=team, by=Caller(actor=identity()))
    was = f" (was {previous})" if previous and previous != team else ""
    click.echo(f"dataset {name}: owned by team {team}{was}")


@datasets_group.command("grant")
@click.argument("name")
@click.argument("team")
@pass_context
def grant_cmd(ctx: Context, name: str, team: str) -> None:
    """Let DAGs of TEAM emit to dataset NAME (which another team owns)."""
    changed = grant_dataset(ctx.db, name, team=team, by=Caller(actor=identity()))
    click.echo(f"granted {name} to team {team}" if changed else f"team {team} was already granted {name}")


@datasets_group.command("revoke")
@click.argument("name")
@click.argument("team")
@pass_context
def revoke_cmd(ctx: Context, name: str, team: str) -> None:
    """Take back TEAM's grant on dataset NAME; its DAGs emitting to it are refused at the next sync."""
    changed = revoke_dataset(ctx.db, name, team=team, by=Caller(actor=identity()))
    click.echo(f"revoked {name} from team {team}" if changed else f"team {team} had no grant on {name}")


@datasets_group.command("access")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def access_cmd(ctx: Context, as_json: bool) -> None:
    """Show which team owns each dataset and which other teams may emit to it."""
    found = list_dataset_access(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        "Dataset owners",
        ["dataset", "owner", "granted to"],
        [(a.dataset, a.owner, ", ".join(a.granted) or None) for a in found],
    )
