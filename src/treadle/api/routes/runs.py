"""Runs: list (filters, keyset cursor), detail, cancel, clear, why; task instance detail."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from treadle.api.deps import authorize, get_db, get_settings, require
from treadle.api.guard import API, Caller
from treadle.api.routes.dags import dag_or_404
from treadle.api.schemas import CancelRequest, ClearRequest, Identifier, RunPage
from treadle.api.settings import ApiSettings
from treadle.domain.access import Action, Role
from treadle.domain.states import RunState, RunType
from treadle.engine import cancellation, clearing, diagnosis, queries
from treadle.engine.cancellation import Cancellation
from treadle.engine.clearing import ClearReport
from treadle.engine.diagnosis import Waiting
from treadle.engine.queries import RunDetail
from treadle.errors import InvalidRequest, RunNotFound
from treadle.store.database import Database

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]


def encode_cursor(created_at: datetime, run_id: str) -> str:
    """The opaque cursor after a run."""
    return base64.urlsafe_b64encode(json.dumps([created_at.isoformat(), run_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, run_id) of a cursor; InvalidRequest naming the parameter if malformed."""
    try:
        at, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return datetime.fromisoformat(at), str(run_id)
    except (ValueError, TypeError):
        raise InvalidRequest("cursor: not a cursor this API returned") from None


def _run_team(db: Database, run_id: str) -> tuple[RunDetail, str]:
    detail = queries.run_detail(db, run_id)
    return detail, dag_or_404(db, detail.run.dag_id).team


@router.get("/runs", response_model=RunPage)
def list_runs(
    db: Db,
    caller: Annotated[Caller, require(Action.READ_DAGS)],
    settings: Annotated[ApiSettings, Depends(get_settings)],
    dag_id: Annotated[Identifier | None, Query()] = None,
    state: RunState | None = None,
    run_type: RunType | None = None,
    limit: Annotated[int, Query(ge=1)] = 50,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> RunPage:
    """Runs of the teams the caller may read, newest first; follow `next_cursor` for older ones."""
    if limit > settings.max_page_size:
        raise InvalidRequest(f"limit: at most {settings.max_page_size} per page")
    teams = caller.principal.teams_with(Role.VIEWER)
    runs = queries.list_runs_page(
        db,
        dag_id=dag_id,
        state=state.value if state else None,
        run_type=run_type.value if run_type else None,
        teams=teams,
        before=decode_cursor(cursor) if cursor else None,
        limit=limit,
    )
    last = runs[-1] if len(runs) == limit else None
    return RunPage(runs=runs, next_cursor=encode_cursor(last.created_at, last.run_id) if last else None)


@router.get("/runs/{run_id}", response_model=RunDetail)
def run_detail(run_id: str, db: Db, caller: Annotated[Caller, require(Action.READ_DAG)]) -> RunDetail:
    """A run with its task instances, every attempt and the results."""
    detail, team = _run_team(db, run_id)
    authorize(caller, Action.READ_DAG, team=team)
    return detail


@router.get("/runs/{run_id}/why", response_model=list[Waiting])
def why(
    run_id: str,
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.READ_DAG)],
    task_id: Annotated[Identifier | None, Query()] = None,
) -> list[Waiting]:
    """Why the run's task instances (or one of them) are not running."""
    _, team = _run_team(db, run_id)
    authorize(caller, Action.READ_DAG, team=team)
    return diagnosis.why(db, run_id, task_id, worker_stale_s=request.app.state.worker_stale_s)


@router.post("/runs/{run_id}/cancel", response_model=Cancellation)
def cancel(
    run_id: str, body: CancelRequest, db: Db, caller: Annotated[Caller, require(Action.CANCEL_RUN)]
) -> Cancellation:
    """Cancel a run (or one task of it, with `task_id`)."""
    _, team = _run_team(db, run_id)
    authorize(caller, Action.CANCEL_RUN, team=team)
    actor = caller.principal.actor
    if body.task_id is not None:
        return cancellation.cancel_task(db, run_id, body.task_id, actor=actor, reason=body.reason)
    return cancellation.cancel_run(db, run_id, actor=actor, reason=body.reason)


@router.post("/runs/{run_id}/clear", response_model=ClearReport)
def clear(
    run_id: str, body: ClearRequest, db: Db, caller: Annotated[Caller, require(Action.CLEAR_TASKS)]
) -> ClearReport:
    """Clear task instances of a run so they run again (all of them without `task_ids`)."""
    _, team = _run_team(db, run_id)
    authorize(caller, Action.CLEAR_TASKS, team=team)
    return clearing.clear_tasks(
        db,
        run_id,
        body.task_ids,
        downstream=body.downstream,
        only_failed=body.only_failed,
        actor=caller.principal.actor,
        reason=body.reason,
    )


@router.get("/runs/{run_id}/tasks/{task_id}", response_model=RunDetail)
def task_detail(
    run_id: str, task_id: str, db: Db, caller: Annotated[Caller, require(Action.READ_DAG)]
) -> RunDetail:
    """One task of a run: its instance, every attempt and its result."""
    detail, team = _run_team(db, run_id)
    authorize(caller, Action.READ_DAG, team=team)
    instances = [t for t in detail.task_instances if t.task_id == task_id]
    if not instances:
        raise RunNotFound(f"run {run_id!r} has no task {task_id!r}")
    return RunDetail(
        run=detail.run,
        task_instances=instances,
        attempts=[a for a in detail.attempts if a.task_id == task_id],
        results={k: v for k, v in detail.results.items() if k == task_id},
    )
