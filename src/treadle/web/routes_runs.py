"""Pages of runs and task instances: Gantt, manifest, cancel and clear; attempts, log, why."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from treadle.api.deps import authorize, get_db, require
from treadle.api.guard import Caller
from treadle.api.routes.dags import dag_or_404
from treadle.domain.access import Action
from treadle.domain.states import TERMINAL_RUN_STATES, RunState, TaskState
from treadle.engine import (
    attempt_logs,
    backfill_actions,
    cancellation,
    clearing,
    datasets,
    diagnosis,
    queries,
)
from treadle.engine.queries import RunDetail
from treadle.errors import InvalidRequest, TaskInstanceNotFound
from treadle.store.database import Database, db_now
from treadle.web import views
from treadle.web.forms import Posted
from treadle.web.render import fragment, page, see_other, shown_errors, viewer

router = APIRouter(include_in_schema=False)
Db = Annotated[Database, Depends(get_db)]
#: Task instance states nothing more happens in (no "why is it not running" for them).
FINISHED = frozenset(
    s.value
    for s in (
        TaskState.SUCCESS,
        TaskState.DEAD_LETTER,
        TaskState.UPSTREAM_FAILED,
        TaskState.SKIPPED,
        TaskState.CANCELLED,
    )
)
#: Largest piece of a log one poll returns.
LOG_CHUNK = 256 * 1024


def _readable_run(
    request: Request, db: Database, run_id: str, action: Action = Action.READ_DAG
) -> tuple[RunDetail, str]:
    detail = queries.run_detail(db, run_id)
    team = dag_or_404(db, detail.run.dag_id).team
    authorize(viewer(request).caller, action, team=team)
    return detail, team


@router.get("/runs/{run_id}", response_class=HTMLResponse)
@shown_errors
def run_page(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_DAG)], run_id: str
) -> Response:
    """A run: its task instances with attempts and durations, a Gantt chart, manifest, provenance."""
    detail, team = _readable_run(request, db, run_id)
    now = db.query(db_now)
    attempts_by_task: dict[str, int] = {}
    for a in detail.attempts:
        attempts_by_task[a.task_id] = attempts_by_task.get(a.task_id, 0) + 1
    backfill = (
        backfill_actions.get_backfill(db, detail.run.backfill_id).status if detail.run.backfill_id else None
    )
    return page(
        request,
        "run.html",
        title=f"Run {run_id}",
        detail=detail,
        team=team,
        gantt=views.gantt(detail.task_instances, now=now),
        now=now,
        backfill=backfill,
        produced=datasets.run_dataset_events(db, run_id),
        finished=RunState(detail.run.state) in TERMINAL_RUN_STATES,
        task_ids=sorted({t.task_id for t in detail.task_instances}),
    )


@router.get("/fragments/runs/{run_id}", response_class=HTMLResponse)
@shown_errors
def run_tasks(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_DAG)], run_id: str
) -> Response:
    """The run's task table and Gantt chart (the page refreshes them while the run is active)."""
    detail, _team = _readable_run(request, db, run_id)
    now = db.query(db_now)
    return fragment(
        "run_tasks.html", detail=detail, gantt=views.gantt(detail.task_instances, now=now), now=now
    )


@router.post("/runs/{run_id}/cancel")
@shown_errors
def cancel(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.CANCEL_RUN)],
    run_id: str,
    form: Posted,
) -> Response:
    """Cancel the run."""
    _readable_run(request, db, run_id, Action.CANCEL_RUN)
    cancellation.cancel_run(
        db, run_id, actor=viewer(request).caller.principal.actor, reason=form.get("reason")
    )
    return see_other(f"/runs/{run_id}")


@router.post("/runs/{run_id}/clear")
@shown_errors
def clear(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.CLEAR_TASKS)],
    run_id: str,
    form: Posted,
) -> Response:
    """Clear the chosen tasks (all failed ones by default), with their downstream if asked."""
    _readable_run(request, db, run_id, Action.CLEAR_TASKS)
    chosen = [t for t in form.all("task_id") if t]
    clearing.clear_tasks(
        db,
        run_id,
        chosen or None,
        downstream=form.has("downstream"),
        only_failed=form.has("only_failed"),
        actor=viewer(request).caller.principal.actor,
        reason=form.get("reason"),
    )
    return see_other(f"/runs/{run_id}")


@router.get("/runs/{run_id}/tasks/{task_id}", response_class=HTMLResponse)
@shown_errors
def task_page(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.READ_DAG)],
    run_id: str,
    task_id: str,
    map_index: Annotated[int, Query(ge=-1)] = -1,
) -> Response:
    """A task instance: every attempt, the log, the result, and why it is not running."""
    detail, team = _readable_run(request, db, run_id)
    mapped = [t for t in detail.task_instances if t.task_id == task_id and t.map_index >= 0]
    instance = next(
        (t for t in detail.task_instances if t.task_id == task_id and t.map_index == map_index), None
    )
    if instance is None and not mapped:
        raise TaskInstanceNotFound(f"run {run_id!r} has no task {task_id!r}")
    attempts = [
        a
        for a in detail.attempts
        if a.task_id == task_id and (instance is None or a.task_instance_id == instance.id)
    ]
    waiting = (
        diagnosis.why(db, run_id, task_id, worker_stale_s=request.app.state.worker_stale_s)
        if instance is not None and instance.state not in FINISHED
        else []
    )
    waiting = [w for w in waiting if w.map_index == map_index]
    outputs = next((a.outputs for a in reversed(attempts) if a.outputs), None)
    result = detail.results.get(task_id)
    if map_index >= 0 and mapped and isinstance(result, list):
        # A mapped task's result is the list of its instances' results, in map index order.
        result = result[map_index] if map_index < len(result) else None
    quality = (outputs or {}).get("quality")
    if quality is None and isinstance(result, dict) and {"state", "checks"} <= result.keys():
        quality = result
    return page(
        request,
        "task.html",
        title=f"{task_id} · {run_id}",
        run=detail.run,
        team=team,
        task_id=task_id,
        instance=instance,
        mapped=sorted(mapped, key=lambda t: t.map_index),
        map_index=map_index,
        attempts=list(reversed(attempts)),
        result=result,
        has_result=task_id in detail.results,
        outputs=outputs,
        quality=quality if isinstance(quality, dict) else None,
        waiting=waiting,
    )


@router.get("/runs/{run_id}/tasks/{task_id}/log")
@shown_errors
def task_log(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.READ_DAG)],
    run_id: str,
    task_id: str,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    map_index: Annotated[int, Query(ge=-1)] = -1,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """A piece of an attempt's log from byte `offset`: {text, offset, running, missing} as JSON."""
    _readable_run(request, db, run_id)
    logs_dir: Path | None = request.app.state.logs_dir
    try:
        location = attempt_logs.locate_attempt(db, run_id, task_id, attempt=attempt, map_index=map_index)
    except InvalidRequest as exc:
        return JSONResponse({"text": "", "offset": 0, "running": False, "missing": str(exc)})
    if logs_dir is None:
        missing = "this server has no logs folder configured"
        return JSONResponse({"text": "", "offset": 0, "running": False, "missing": missing})
    path = location.log_path(logs_dir)
    running = attempt_logs.is_running(db, location) if location.running else False
    try:
        with path.open("rb") as log:
            log.seek(offset)
            chunk = log.read(LOG_CHUNK)
    except FileNotFoundError:
        where = f" (it ran on {location.hostname})" if location.hostname else ""
        missing = "" if running else f"no log file for attempt {location.attempt} on this host{where}"
        return JSONResponse({"text": "", "offset": offset, "running": running, "missing": missing})
    more = len(chunk) == LOG_CHUNK
    return JSONResponse(
        {
            "text": chunk.decode("utf-8", errors="replace"),
            "offset": offset + len(chunk),
            "running": running or more,
            "missing": "",
            "attempt": location.attempt,
        }
    )
