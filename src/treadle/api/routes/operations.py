"""Operations: dead letters, needs inspection, pools, queues, workers, datasets, backfills, audit."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.responses import JSONResponse

from treadle.api.deps import authorize, get_db, get_settings, require
from treadle.api.guard import API, Caller
from treadle.api.idempotency import RESPONSES, IdempotencyKey, answer_once
from treadle.api.routes.dags import dag_or_404
from treadle.api.schemas import (
    AuditPage,
    BigRowId,
    Identifier,
    PoolRequest,
    RequeueResult,
    ResolveRequest,
    RowId,
)
from treadle.api.settings import ApiSettings
from treadle.domain.access import Action, Role
from treadle.domain.states import TaskState
from treadle.domain.task_records import TaskInstanceInfo, WorkerInfo
from treadle.engine import accounts, backfill_actions, datasets, inspection, pools, queries
from treadle.engine import dead_letters as letters
from treadle.engine.backfill_actions import BackfillDetail, BackfillStatus
from treadle.engine.datasets import DatasetView
from treadle.engine.dead_letters import DeadLetter, DeadLetterGroup
from treadle.engine.inspection import Inspection
from treadle.engine.queries import QueueView
from treadle.errors import InvalidRequest, TaskInstanceNotFound
from treadle.store.database import Database
from treadle.store.datasets import DatasetEventInfo
from treadle.store.pools import PoolInfo

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]
Settings = Annotated[ApiSettings, Depends(get_settings)]


def _visible(caller: Caller, db: Database) -> tuple[frozenset[str] | None, dict[str, str]]:
    return caller.principal.teams_with(Role.VIEWER), queries.dag_teams(db)


def _sees(teams: frozenset[str] | None, dag_team: str | None) -> bool:
    return teams is None or (dag_team is not None and dag_team in teams)


@router.get("/dead-letters", response_model=list[DeadLetter])
def list_dead_letters(db: Db, caller: Annotated[Caller, require(Action.READ_DAGS)]) -> list[DeadLetter]:
    """Dead letters of the teams the caller may read, each with its last attempt."""
    teams, owners = _visible(caller, db)
    return [d for d in letters.list_dead_letters(db) if _sees(teams, owners.get(d.task_instance.dag_id))]


@router.get("/dead-letters/groups", response_model=list[DeadLetterGroup])
def grouped_dead_letters(
    db: Db, caller: Annotated[Caller, require(Action.READ_DAGS)]
) -> list[DeadLetterGroup]:
    """The caller's dead letters grouped by error fingerprint."""
    return letters.group_dead_letters(list_dead_letters(db, caller))


@router.post("/dead-letters/{task_instance_id}/requeue", response_model=TaskInstanceInfo, responses=RESPONSES)
def requeue_one(
    task_instance_id: BigRowId,
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.REQUEUE_DEAD_LETTER)],
    idempotency_key: IdempotencyKey = None,
) -> TaskInstanceInfo | JSONResponse:
    """Queue one dead letter again with a fresh retry budget.

    With an `Idempotency-Key`, a retry gets the first response, even once the instance ran and
    failed again, and requeues nothing more.
    """

    found = queries.task_instance(db, task_instance_id)
    if found is None:
        raise TaskInstanceNotFound(f"no dead letter {task_instance_id}")
    authorize(caller, Action.REQUEUE_DEAD_LETTER, team=dag_or_404(db, found.dag_id).team)

    def make() -> TaskInstanceInfo:
        # Checked here, not above: a retry with the key gets its answer although the instance
        # is no dead letter any more.
        if found.state != TaskState.DEAD_LETTER.value:
            raise TaskInstanceNotFound(f"no dead letter {task_instance_id}")
        return letters.requeue_dead_letter(
            db, task_instance_id, actor=caller.principal.actor, address=caller.address
        )

    return answer_once(
        request, caller, key=idempotency_key, body=None, status_code=200, model=TaskInstanceInfo, make=make
    )


@router.post("/dead-letters/groups/{fingerprint}/requeue", response_model=RequeueResult)
def requeue_group(
    fingerprint: str,
    db: Db,
    caller: Annotated[Caller, require(Action.REQUEUE_DEAD_LETTER)],
) -> RequeueResult:
    """Requeue every dead letter with this fingerprint (all must be of teams the caller operates)."""
    owners = queries.dag_teams(db)
    group = [d for d in letters.list_dead_letters(db) if d.fingerprint == fingerprint]
    if not group:
        raise InvalidRequest(f"no dead letter has fingerprint {fingerprint!r}")
    for team in sorted({owners.get(d.task_instance.dag_id, "default") for d in group}):
        authorize(caller, Action.REQUEUE_DEAD_LETTER, team=team)
    done = letters.requeue_fingerprint(db, fingerprint, actor=caller.principal.actor, address=caller.address)
    return RequeueResult(requeued=done.requeued, refused=done.refused)


@router.get("/needs-inspection", response_model=list[Inspection])
def needs_inspection(db: Db, caller: Annotated[Caller, require(Action.READ_DAGS)]) -> list[Inspection]:
    """Task instances waiting for an operator (unknown commit), oldest first."""
    teams, owners = _visible(caller, db)
    return [
        i for i in inspection.list_needs_inspection(db) if _sees(teams, owners.get(i.task_instance.dag_id))
    ]


@router.post("/runs/{run_id}/tasks/{task_id}/resolve", response_model=TaskInstanceInfo)
def resolve(
    run_id: str,
    task_id: str,
    body: ResolveRequest,
    db: Db,
    caller: Annotated[Caller, require(Action.RESOLVE_INSPECTION)],
) -> TaskInstanceInfo:
    """Resolve a needs_inspection task instance as success, failed or requeue (a reason is required)."""
    run = queries.run_detail(db, run_id).run
    authorize(caller, Action.RESOLVE_INSPECTION, team=dag_or_404(db, run.dag_id).team)
    return inspection.resolve(
        db, run_id, task_id, resolution=body.resolution, reason=body.reason, actor=caller.principal.actor
    )


@router.get("/pools", response_model=list[PoolInfo])
def list_pools(db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]) -> list[PoolInfo]:
    """Every pool with its slots in use."""
    return pools.list_pools(db)


@router.put("/pools/{name}", response_model=list[PoolInfo])
def set_pool(
    name: Identifier, body: PoolRequest, db: Db, caller: Annotated[Caller, require(Action.WRITE_POOLS)]
) -> list[PoolInfo]:
    """Create a pool or change its slots."""
    pools.set_pool(db, name, slots=body.slots, description=body.description, actor=caller.principal.actor)
    return [p for p in pools.list_pools(db) if p.name == name]


@router.delete("/pools/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_pool(
    name: Identifier, db: Db, caller: Annotated[Caller, require(Action.WRITE_POOLS)], force: bool = False
) -> Response:
    """Delete a pool (refused while task instances use it, unless `force`)."""
    pools.delete_pool(db, name, actor=caller.principal.actor, force=force)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/queues", response_model=list[QueueView])
def list_queues(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]
) -> list[QueueView]:
    """Every queue with work or a live worker: depth, oldest wait, workers."""
    return queries.list_queues(db, worker_stale_s=request.app.state.worker_stale_s)


@router.get("/workers", response_model=list[WorkerInfo])
def list_workers(db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]) -> list[WorkerInfo]:
    """Every registered worker and its load."""
    return queries.list_workers(db)


@router.get("/datasets", response_model=list[DatasetView])
def list_datasets(db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]) -> list[DatasetView]:
    """Every dataset: events, producers, consumers."""
    return datasets.list_datasets(db)


@router.get("/datasets/{name}/events", response_model=list[DatasetEventInfo])
def dataset_events(
    name: str,
    db: Db,
    _caller: Annotated[Caller, require(Action.READ_OPERATIONS)],
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[DatasetEventInfo]:
    """The newest events of one dataset."""
    return datasets.dataset_events(db, name, limit=limit)


@router.get("/backfills", response_model=list[BackfillStatus])
def list_backfills(
    db: Db,
    caller: Annotated[Caller, require(Action.READ_DAGS)],
    dag_id: Annotated[Identifier | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[BackfillStatus]:
    """Backfills (of the caller's teams) with their progress."""
    teams, owners = _visible(caller, db)
    found = backfill_actions.list_backfills(db, dag_id=dag_id, limit=limit)
    return [b for b in found if _sees(teams, owners.get(b.backfill.dag_id))]


@router.get("/backfills/{backfill_id}", response_model=BackfillDetail)
def backfill_detail(
    backfill_id: RowId, db: Db, caller: Annotated[Caller, require(Action.READ_DAG)]
) -> BackfillDetail:
    """One backfill: its counts and its runs."""
    detail = backfill_actions.get_backfill(db, backfill_id)
    authorize(caller, Action.READ_DAG, team=dag_or_404(db, detail.status.backfill.dag_id).team)
    return detail


@router.get("/audit", response_model=AuditPage)
def audit_log(
    db: Db,
    settings: Settings,
    _caller: Annotated[Caller, require(Action.READ_AUDIT)],
    since: datetime | None = None,
    actor: Annotated[str | None, Query(max_length=250)] = None,
    action: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1)] = 100,
    cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> AuditPage:
    """The audit log, newest first (admins of every team only: S15)."""
    if limit > settings.max_page_size:
        raise InvalidRequest(f"limit: at most {settings.max_page_size} per page")
    if since is not None and since.tzinfo is None:
        raise InvalidRequest("since: give a time zone (e.g. 2026-12-01T10:00:00Z)")
    entries = accounts.list_audit(db, since=since, actor=actor, action=action, before_id=cursor, limit=limit)
    last = entries[-1] if len(entries) == limit else None
    return AuditPage(entries=entries, next_cursor=str(last.id) if last else None)
