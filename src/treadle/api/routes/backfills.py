"""Backfills over HTTP: request one (or its dry run), pause, unpause, cancel.

Listing and progress (`GET /backfills`, `GET /backfills/{id}`) are in routes/operations.py.
The scheduler leader creates the runs; these routes only record the request or change its state.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from treadle.api.deps import authorize, get_db, require
from treadle.api.guard import API, Caller
from treadle.api.idempotency import RESPONSES, IdempotencyKey, answer_once
from treadle.api.routes.dags import dag_or_404
from treadle.api.schemas import Reason, RowId, Strict
from treadle.domain.access import Action
from treadle.domain.backfill_plan import BackfillPlan
from treadle.engine import backfill_actions
from treadle.engine.backfill_actions import BackfillCancellation
from treadle.store.backfills import BackfillInfo
from treadle.store.database import Database

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]
#: An ISO date or date-time; without an offset it is read in the DAG's schedule time zone.
DateText = Annotated[str, Field(min_length=1, max_length=64)]


class BackfillRequest(Strict):
    from_date: DateText
    to_date: DateText
    #: Why these intervals run (recorded in the audit log).
    reason: Annotated[str, Field(min_length=1, max_length=2000)]
    #: Most runs active at once (default: the DAG's max_active_runs).
    max_active: Annotated[int | None, Field(ge=1, le=10_000)] = None
    mode: Literal["normal", "shadow"] = "normal"
    rerun: Literal["none", "failed", "all"] = "none"


class CancelBackfill(Strict):
    reason: Reason = ""


class BackfillChange(BaseModel):
    backfill_id: int
    #: False when the backfill already was in the asked state.
    changed: bool
    state: str


def _request(request: Request, dag_id: str, body: BackfillRequest) -> dict[str, object]:
    return {
        "dag_id": dag_id,
        "from_date": body.from_date,
        "to_date": body.to_date,
        "reason": body.reason,
        "max_active": body.max_active,
        "mode": body.mode,
        "rerun": body.rerun,
        "max_span_days": request.app.state.backfill_max_span_days,
    }


@router.post("/dags/{dag_id}/backfills/dry-run", response_model=BackfillPlan)
def dry_run(
    dag_id: str,
    body: BackfillRequest,
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.RUN_BACKFILL)],
) -> BackfillPlan:
    """The intervals (logical dates) a backfill request covers and what would happen to each."""
    authorize(caller, Action.RUN_BACKFILL, team=dag_or_404(db, dag_id).team)
    return backfill_actions.plan_backfill(db, **_request(request, dag_id, body))  # type: ignore[arg-type]


@router.post(
    "/dags/{dag_id}/backfills",
    response_model=BackfillInfo,
    status_code=status.HTTP_201_CREATED,
    responses={429: {"description": "Overloaded: a limit on queued task instances"}, **RESPONSES},
)
def create(
    dag_id: str,
    body: BackfillRequest,
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.RUN_BACKFILL)],
    idempotency_key: IdempotencyKey = None,
) -> BackfillInfo | JSONResponse:
    """Record a backfill; the scheduler leader starts its runs, at most `max_active` at once.

    Refused with 429 when its first runs would exceed a limit on queued task instances. With an
    `Idempotency-Key`, a retry gets the first response and records no second backfill.
    """
    authorize(caller, Action.RUN_BACKFILL, team=dag_or_404(db, dag_id).team)

    def make() -> BackfillInfo:
        return backfill_actions.create_backfill(
            db,
            requested_by=caller.principal.actor,
            address=caller.address,
            admission=request.app.state.admission,
            **_request(request, dag_id, body),  # type: ignore[arg-type]
        )

    return answer_once(
        request, caller, key=idempotency_key, body=body, status_code=201, model=BackfillInfo, make=make
    )


def _authorize_backfill(db: Database, caller: Caller, backfill_id: int) -> None:
    found = backfill_actions.get_backfill(db, backfill_id).status.backfill
    authorize(caller, Action.RUN_BACKFILL, team=dag_or_404(db, found.dag_id).team)


def _set_paused(db: Database, caller: Caller, backfill_id: int, *, paused: bool) -> BackfillChange:
    _authorize_backfill(db, caller, backfill_id)
    changed = backfill_actions.set_backfill_paused(
        db, backfill_id, paused=paused, actor=caller.principal.actor, address=caller.address
    )
    return BackfillChange(backfill_id=backfill_id, changed=changed, state="paused" if paused else "running")


@router.post("/backfills/{backfill_id}/pause", response_model=BackfillChange)
def pause(
    backfill_id: RowId, db: Db, caller: Annotated[Caller, require(Action.RUN_BACKFILL)]
) -> BackfillChange:
    """Pause a backfill: no new runs; its active runs go on."""
    return _set_paused(db, caller, backfill_id, paused=True)


@router.post("/backfills/{backfill_id}/unpause", response_model=BackfillChange)
def unpause(
    backfill_id: RowId, db: Db, caller: Annotated[Caller, require(Action.RUN_BACKFILL)]
) -> BackfillChange:
    """Let a paused backfill start runs again."""
    return _set_paused(db, caller, backfill_id, paused=False)


@router.post("/backfills/{backfill_id}/cancel", response_model=BackfillCancellation)
def cancel(
    backfill_id: RowId,
    body: CancelBackfill,
    db: Db,
    caller: Annotated[Caller, require(Action.RUN_BACKFILL)],
) -> BackfillCancellation:
    """Cancel a backfill and its queued and running runs."""
    _authorize_backfill(db, caller, backfill_id)
    return backfill_actions.cancel_backfill(
        db, backfill_id, actor=caller.principal.actor, reason=body.reason, address=caller.address
    )
