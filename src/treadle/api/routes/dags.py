"""DAGs: list, detail (structure, schedule, next fires), load errors, pause, trigger."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import JSONResponse

from treadle.api.deps import authorize, get_db, require
from treadle.api.guard import API, Caller, audited_with_change
from treadle.api.idempotency import RESPONSES, IdempotencyKey, answer_once
from treadle.api.schemas import DagDetail, Identifier, ScheduleOut, TriggerRequest
from treadle.domain.access import Action, Role
from treadle.domain.records import DagInfo, LoadErrorInfo, RunInfo
from treadle.engine import pausing, queries, schedules
from treadle.engine.runs import trigger_run
from treadle.errors import DagNotFound
from treadle.store.database import Database

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]
#: How many coming fire times a DAG's detail lists.
NEXT_FIRES = 5


def dag_or_404(db: Database, dag_id: str) -> DagInfo:
    """The DAG, or DagNotFound."""
    found = queries.get_dag(db, dag_id)
    if found is None:
        raise DagNotFound(f"no DAG {dag_id!r} is registered")
    return found


@router.get("/dags", response_model=list[DagInfo])
def list_dags(
    db: Db,
    caller: Annotated[Caller, require(Action.READ_DAGS)],
    team: Annotated[Identifier | None, Query()] = None,
    tag: Annotated[str | None, Query(max_length=250)] = None,
    paused: bool | None = None,
) -> list[DagInfo]:
    """DAGs of the teams the caller may read, filtered by team, tag and paused."""
    visible = caller.principal.teams_with(Role.VIEWER)
    return [
        d
        for d in queries.list_dags(db)
        if (visible is None or d.team in visible)
        and (team is None or d.team == team)
        and (tag is None or tag in d.tags)
        and (paused is None or d.is_paused == paused)
    ]


@router.get("/dag-load-errors", response_model=list[LoadErrorInfo])
def load_errors(db: Db, _caller: Annotated[Caller, require(Action.READ_LOAD_ERRORS)]) -> list[LoadErrorInfo]:
    """DAG files that failed to load (files belong to no team: viewers of every team only)."""
    return queries.list_load_errors(db)


@router.get("/dags/{dag_id}", response_model=DagDetail)
def dag_detail(dag_id: str, db: Db, caller: Annotated[Caller, require(Action.READ_DAG)]) -> DagDetail:
    """A DAG with its latest structure, its schedule and its next fire times."""
    dag = dag_or_404(db, dag_id)
    authorize(caller, Action.READ_DAG, team=dag.team)
    structure = queries.dag_structure(db, dag_id)
    view = schedules.schedule_view(db, dag_id)
    schedule = None
    if view.spec is not None:
        spec_json = view.spec.to_json()
        schedule = ScheduleOut(
            spec=spec_json,
            description=schedules.describe(spec_json),
            last_fire_at=view.last_fire_at,
            next_fire_at=view.next_fire_at,
            next_fires=[s.fire_at for s in schedules.upcoming(view.spec, after=view.now, count=NEXT_FIRES)]
            if view.spec.is_timed
            else [],
        )
    return DagDetail(dag=dag, structure=structure.to_json(), schedule=schedule)


def _pause(db: Database, caller: Caller, dag_id: str, *, paused: bool) -> DagInfo:
    dag = dag_or_404(db, dag_id)
    authorize(caller, Action.PAUSE_DAG, team=dag.team)
    pausing.set_paused(db, dag_id, paused=paused, actor=caller.principal.actor)
    return dag_or_404(db, dag_id)


@router.post("/dags/{dag_id}/pause", response_model=DagInfo)
def pause(dag_id: str, db: Db, caller: Annotated[Caller, require(Action.PAUSE_DAG)]) -> DagInfo:
    """Pause a DAG: no new scheduled runs."""
    return _pause(db, caller, dag_id, paused=True)


@router.post("/dags/{dag_id}/unpause", response_model=DagInfo)
def unpause(dag_id: str, db: Db, caller: Annotated[Caller, require(Action.PAUSE_DAG)]) -> DagInfo:
    """Unpause a DAG."""
    return _pause(db, caller, dag_id, paused=False)


@router.post(
    "/dags/{dag_id}/runs",
    response_model=RunInfo,
    status_code=status.HTTP_201_CREATED,
    responses={429: {"description": "Overloaded: a limit on queued task instances"}, **RESPONSES},
)
def trigger(
    dag_id: str,
    body: TriggerRequest,
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.TRIGGER_RUN)],
    idempotency_key: IdempotencyKey = None,
) -> RunInfo | JSONResponse:
    """Start a manual run; a conf that breaks the params schema is a 422 listing every violation.

    A run that would exceed a limit on queued task instances is refused: 429 with Retry-After,
    the body naming the limit (`limit.setting`). With an `Idempotency-Key`, a retry gets the
    first response and starts no second run.
    """

    def make() -> RunInfo:
        # One transaction: the DAG's team checked, the run made, the trigger and this call audited
        # (and, with a key, the key claimed).
        with audited_with_change(request, status=status.HTTP_201_CREATED):
            return trigger_run(
                db,
                dag_id,
                conf=body.conf,
                triggered_by=caller.principal.actor,
                default_queue_timeout_s=request.app.state.queue_timeout_s,
                address=caller.address,
                admission=request.app.state.admission,
                check=lambda dag: authorize(caller, Action.TRIGGER_RUN, team=dag.team),
                masked=True,
            )

    return answer_once(
        request, caller, key=idempotency_key, body=body, status_code=201, model=RunInfo, make=make
    )
