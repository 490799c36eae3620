"""`treadle backfill` (request one, dry run, watch it) and `treadle backfills` (list, show, pause,
unpause, cancel). The scheduler leader creates the runs; this command only records the request."""

from __future__ import annotations

import time
from datetime import datetime
from zoneinfo import ZoneInfo

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import StatusLine, bar, emit_json, fmt_elapsed, fmt_time, table, to_jsonable
from treadle.domain.backfill_plan import MODES, BackfillPlan
from treadle.engine import backfill_actions as engine
from treadle.errors import InvalidRequest

#: Seconds between two polls of a watched backfill.
POLL_S = 0.5
#: Most runs `backfills show` lists in its table (--json gives them all).
SHOW_RUNS = 100


@cli.command("backfill")
@click.argument("dag_id")
@click.option("--from", "from_date", required=True, help="First logical date (ISO date or date-time).")
@click.option(
    "--to",
    "to_date",
    required=True,
    help="Last logical date, inclusive (ISO date or date-time; a date alone is that whole day "
    "in the DAG's time zone).",
)
@click.option("--reason", default=None, help="Why these intervals run (required; recorded in the audit log).")
@click.option(
    "--max-active", type=int, default=None, help="Most runs active at once [DAG's max_active_runs]."
)
@click.option(
    "--mode",
    type=click.Choice(list(MODES)),
    default="normal",
    show_default=True,
    help="shadow: runs record no dataset events.",
)
@click.option("--rerun-failed", is_flag=True, help="Clear and rerun intervals whose run failed.")
@click.option("--rerun-all", is_flag=True, help="Clear and rerun every interval that already has a run.")
@click.option("--dry-run", is_flag=True, help="Print the intervals and what would happen; record nothing.")
@click.option("--no-wait", is_flag=True, help="Do not watch the backfill's progress.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (and do not watch).")
@pass_context
def backfill_cmd(
    ctx: Context,
    dag_id: str,
    from_date: str,
    to_date: str,
    reason: str | None,
    max_active: int | None,
    mode: str,
    rerun_failed: bool,
    rerun_all: bool,
    dry_run: bool,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Run DAG_ID over the schedule intervals whose logical date is within --from .. --to.

    Dates without an offset are read in the DAG's schedule time zone. A run covers its data
    interval [logical date, next fire); only intervals that have ended are included. Intervals
    that already have a run are skipped unless --rerun-failed or --rerun-all.
    """
    if rerun_failed and rerun_all:
        raise InvalidRequest("--rerun-failed and --rerun-all exclude each other; give one of them")
    rerun = "failed" if rerun_failed else "all" if rerun_all else "none"
    if dry_run:
        plan = engine.plan_backfill(
            ctx.db,
            dag_id,
            from_date=from_date,
            to_date=to_date,
            reason=reason or "",
            max_active=max_active,
            mode=mode,
            rerun=rerun,
            max_span_days=ctx.settings.backfill_max_span_days,
        )
        _print_plan(plan, as_json=as_json)
        return
    info = engine.create_backfill(
        ctx.db,
        dag_id,
        from_date=from_date,
        to_date=to_date,
        reason=reason or "",
        requested_by=identity(),
        max_active=max_active,
        mode=mode,
        rerun=rerun,
        max_span_days=ctx.settings.backfill_max_span_days,
        admission=ctx.settings.admission_limits,
    )
    if as_json:
        emit_json(info)
        return
    click.echo(
        f"backfill {info.id} created: DAG {info.dag_id}, {info.total} interval(s) with logical dates "
        f"{fmt_time(info.from_date)} .. {fmt_time(info.to_date)}, at most {info.max_active} run(s) "
        f"active, mode {info.mode}, rerun {info.rerun}"
    )
    if _dag_paused(ctx, dag_id):
        click.echo(f"DAG {dag_id} is paused: the backfill creates runs once it is unpaused")
    if not no_wait:
        _watch(ctx, info.id, info.total)


def _dag_paused(ctx: Context, dag_id: str) -> bool:
    from treadle.engine import queries

    dag = queries.get_dag(ctx.db, dag_id)
    return bool(dag and dag.is_paused)


def _print_plan(plan: BackfillPlan, *, as_json: bool) -> None:
    if as_json:
        emit_json({**to_jsonable(plan), "total": plan.total, "dry_run": True})
        return
    zone = ZoneInfo(plan.timezone)

    def local(value: datetime) -> str:
        return value.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")

    table(
        f"dry run: backfill of {plan.dag_id} ({plan.timezone}), {plan.total} interval(s), "
        f"rerun {plan.rerun}, mode {plan.mode}, at most {plan.max_active} active",
        ["logical date", "data interval", "existing run", "action"],
        [
            (
                local(i.logical_date),
                f"{local(i.data_interval_start)} -> {local(i.data_interval_end)}",
                f"{i.existing_run_type} {i.existing_state} ({i.existing_run_id})"
                if i.existing_run_id
                else "-",
                i.action,
            )
            for i in plan.intervals
        ],
    )
    summary = ", ".join(f"{n} {action}" for action, n in sorted(plan.actions.items()))
    click.echo(f"would handle {plan.total} interval(s): {summary}; nothing was recorded (dry run)")
    if plan.open_intervals_left_out:
        click.echo("intervals that have not ended yet are left out (the scheduler runs them)")
    if plan.dag_paused:
        click.echo(f"DAG {plan.dag_id} is paused: a backfill would create runs once it is unpaused")


def _counts(s: engine.BackfillStatus) -> str:
    return f"{s.runs_success} success, {s.runs_failed} failed, {s.runs_active} active, {s.skipped} skipped"


def _progress(backfill_id: int, s: engine.BackfillStatus, total: int) -> str:
    fraction = s.completed / total if total else 1.0
    return f"backfill {backfill_id} {bar(fraction)} {fraction:4.0%} {s.completed}/{total} {_counts(s)}"


def _watch(ctx: Context, backfill_id: int, total: int) -> None:
    """Show the progress until the backfill is done, paused or cancelled (one line redrawn on a
    terminal, a line per change elsewhere); Ctrl-C stops watching."""
    status: engine.BackfillStatus | None = None
    line = StatusLine()
    started = time.monotonic()
    try:
        while True:
            status = engine.get_backfill(ctx.db, backfill_id).status
            line.show(_progress(backfill_id, status, total), fmt_elapsed(time.monotonic() - started))
            if status.backfill.state in ("done", "paused", "cancelled"):
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        line.end()
        click.echo(
            f"stopped watching; backfill {backfill_id} goes on. Watch it: treadle backfills show "
            f"{backfill_id}; cancel it: treadle backfills cancel {backfill_id}"
        )
        return
    line.end()
    assert status is not None
    click.echo(f"backfill {backfill_id} {status.backfill.state}: {_counts(status)}")


@cli.group("backfills")
def backfills_group() -> None:
    """Backfills: requests to run a DAG over past intervals."""


@backfills_group.command("list")
@click.option("--dag", "dag_id", default=None, help="Only backfills of this DAG.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, dag_id: str | None, limit: int, as_json: bool) -> None:
    """List the newest backfills with their progress."""
    found = engine.list_backfills(ctx.db, dag_id=dag_id, limit=limit)
    if as_json:
        emit_json(found)
        return
    table(
        "Backfills",
        ["id", "dag id", "logical dates (UTC)", "state", "handled", "runs ok/failed/active", "by", "reason"],
        [
            (
                s.backfill.id,
                s.backfill.dag_id,
                f"{fmt_time(s.backfill.from_date)} .. {fmt_time(s.backfill.to_date)}",
                s.backfill.state,
                f"{s.backfill.handled}/{s.backfill.total}",
                f"{s.runs_success}/{s.runs_failed}/{s.runs_active}",
                s.backfill.requested_by,
                s.backfill.reason[:80],
            )
            for s in found
        ],
    )


@backfills_group.command("show")
@click.argument("backfill_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def show_cmd(ctx: Context, backfill_id: int, as_json: bool) -> None:
    """Show a backfill: its request, progress and runs."""
    detail = engine.get_backfill(ctx.db, backfill_id)
    if as_json:
        emit_json(detail)
        return
    s = detail.status
    b = s.backfill
    click.echo(f"backfill {b.id}  dag {b.dag_id}  state {b.state}  by {b.requested_by}")
    click.echo(f"reason: {b.reason}")
    click.echo(
        f"logical dates {fmt_time(b.from_date)} .. {fmt_time(b.to_date)}  mode {b.mode}  "
        f"rerun {b.rerun}  max active {b.max_active}"
    )
    click.echo(
        f"handled {b.handled}/{b.total}  next fire {fmt_time(b.cursor)}  {_counts(s)}  "
        f"created {fmt_time(b.created_at)}  ended {fmt_time(b.ended_at)}"
    )
    runs = detail.runs
    table(
        f"Runs ({len(runs)}" + (f", first {SHOW_RUNS} shown" if len(runs) > SHOW_RUNS else "") + ")",
        ["run id", "type", "logical date (UTC)", "state", "started", "ended"],
        [
            (
                r.run_id,
                r.run_type,
                fmt_time(r.logical_date),
                r.state,
                fmt_time(r.started_at),
                fmt_time(r.ended_at),
            )
            for r in runs[:SHOW_RUNS]
        ],
    )


@backfills_group.command("pause")
@click.argument("backfill_id", type=int)
@pass_context
def pause_cmd(ctx: Context, backfill_id: int) -> None:
    """Pause a backfill: no new runs start; active ones go on."""
    changed = engine.set_backfill_paused(ctx.db, backfill_id, paused=True, actor=identity())
    click.echo(f"paused backfill {backfill_id}" if changed else f"backfill {backfill_id} was already paused")


@backfills_group.command("unpause")
@click.argument("backfill_id", type=int)
@pass_context
def unpause_cmd(ctx: Context, backfill_id: int) -> None:
    """Unpause a backfill: the scheduler goes on creating its runs."""
    changed = engine.set_backfill_paused(ctx.db, backfill_id, paused=False, actor=identity())
    click.echo(f"unpaused backfill {backfill_id}" if changed else f"backfill {backfill_id} was not paused")


@backfills_group.command("cancel")
@click.argument("backfill_id", type=int)
@click.option("--reason", default="", help="Why (recorded in the audit log).")
@pass_context
def cancel_cmd(ctx: Context, backfill_id: int, reason: str) -> None:
    """Cancel a backfill: no new runs, and its queued and running runs are cancelled."""
    done = engine.cancel_backfill(ctx.db, backfill_id, actor=identity(), reason=reason)
    what = "cancelled" if done.changed else "was already cancelled;"
    click.echo(f"backfill {backfill_id} {what} {len(done.runs_cancelled)} active run(s) cancelled")
