"""Operations pages: dead letters and needs_inspection (with their repairs), datasets, pools and
queues, workers, scheduler leadership, backfills, and the audit log."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from treadle.api.deps import authorize, get_db, require
from treadle.api.guard import Caller
from treadle.api.routes.dags import dag_or_404
from treadle.domain.access import Action, Role
from treadle.engine import accounts, backfill_actions, datasets, inspection, pools, queries
from treadle.engine import dead_letters as letters
from treadle.errors import InvalidRequest, PermissionDenied, TaskInstanceNotFound
from treadle.store.database import Database, db_now
from treadle.web import views
from treadle.web.forms import Posted
from treadle.web.render import page, see_other, shown_errors, viewer

router = APIRouter(include_in_schema=False)
Db = Annotated[Database, Depends(get_db)]
#: Newest events listed per dataset.
DATASET_EVENTS = 5
AUDIT_PAGE = 100


def _teams(request: Request, db: Database) -> tuple[frozenset[str] | None, dict[str, str]]:
    return viewer(request).caller.principal.teams_with(Role.VIEWER), queries.dag_teams(db)


def _sees(teams: frozenset[str] | None, team: str | None) -> bool:
    return teams is None or (team is not None and team in teams)


@router.get("/dead-letters", response_class=HTMLResponse)
@shown_errors
def dead_letters(request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_DAGS)]) -> Response:
    """Dead letters grouped by error fingerprint, and the task instances needing inspection."""
    teams, owners = _teams(request, db)
    found = [d for d in letters.list_dead_letters(db) if _sees(teams, owners.get(d.task_instance.dag_id))]
    groups = letters.group_dead_letters(found)
    by_fingerprint: dict[str, list[letters.DeadLetter]] = {}
    for d in found:
        by_fingerprint.setdefault(d.fingerprint, []).append(d)
    inspect = [
        i for i in inspection.list_needs_inspection(db) if _sees(teams, owners.get(i.task_instance.dag_id))
    ]
    return page(
        request,
        "dead_letters.html",
        title="Dead letters",
        groups=groups,
        members=by_fingerprint,
        owners=owners,
        inspections=inspect,
        reason_error=request.query_params.get("reason_error", ""),
    )


@router.post("/dead-letters/{task_instance_id}/requeue")
@shown_errors
def requeue_one(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.REQUEUE_DEAD_LETTER)],
    task_instance_id: int,
    form: Posted,
) -> Response:
    """Queue one dead letter again with a fresh retry budget."""
    who = viewer(request).caller
    found = next((d for d in letters.list_dead_letters(db) if d.task_instance.id == task_instance_id), None)
    if found is None:
        raise TaskInstanceNotFound(f"no dead letter {task_instance_id}")
    authorize(who, Action.REQUEUE_DEAD_LETTER, team=dag_or_404(db, found.task_instance.dag_id).team)
    letters.requeue_dead_letter(db, task_instance_id, actor=who.principal.actor, address=who.address)
    return see_other("/dead-letters")


@router.post("/dead-letters/groups/{fingerprint}/requeue")
@shown_errors
def requeue_group(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.REQUEUE_DEAD_LETTER)],
    fingerprint: str,
    form: Posted,
) -> Response:
    """Requeue every dead letter with this fingerprint (all must be of teams the viewer operates)."""
    who = viewer(request).caller
    owners = queries.dag_teams(db)
    group = [d for d in letters.list_dead_letters(db) if d.fingerprint == fingerprint]
    if not group:
        raise InvalidRequest(f"no dead letter has fingerprint {fingerprint!r}")
    for team in sorted({owners.get(d.task_instance.dag_id, "default") for d in group}):
        authorize(who, Action.REQUEUE_DEAD_LETTER, team=team)
    letters.requeue_fingerprint(db, fingerprint, actor=who.principal.actor, address=who.address)
    return see_other("/dead-letters")


@router.post("/runs/{run_id}/tasks/{task_id}/resolve")
@shown_errors
def resolve(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.RESOLVE_INSPECTION)],
    run_id: str,
    task_id: str,
    form: Posted,
) -> Response:
    """Resolve a needs_inspection task instance; a reason is required."""
    who = viewer(request).caller
    run = queries.run_detail(db, run_id).run
    authorize(who, Action.RESOLVE_INSPECTION, team=dag_or_404(db, run.dag_id).team)
    reason = form.get("reason")
    try:
        resolution = inspection.Resolution(form.get("resolution"))
    except ValueError:
        raise InvalidRequest("resolution: choose success, failed or requeue") from None
    if not reason:
        return see_other("/dead-letters?reason_error=give+a+reason+for+the+resolution#inspection")
    inspection.resolve(db, run_id, task_id, resolution=resolution, reason=reason, actor=who.principal.actor)
    return see_other("/dead-letters#inspection")


@router.get("/operations", response_class=HTMLResponse)
@shown_errors
def operations(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]
) -> Response:
    """Datasets, pools and queues, workers, scheduler leadership and backfills."""
    who = viewer(request)
    if not who.can("read_operations"):
        raise PermissionDenied("the operations page needs the role viewer in some team")
    teams, owners = _teams(request, db)
    sets = datasets.list_datasets(db)
    events = {d.name: datasets.dataset_events(db, d.name, limit=DATASET_EVENTS) for d in sets}
    fills = [
        b
        for b in backfill_actions.list_backfills(db, limit=50)
        if _sees(teams, owners.get(b.backfill.dag_id))
    ]
    return page(
        request,
        "operations.html",
        title="Operations",
        datasets=sets,
        events=events,
        pools=pools.list_pools(db),
        queues=queries.list_queues(db, worker_stale_s=request.app.state.worker_stale_s),
        workers=queries.list_workers(db),
        stale_s=request.app.state.worker_stale_s,
        leader=views.leader(db),
        backfills=fills,
        now=db.query(db_now),
    )


@router.get("/audit", response_class=HTMLResponse)
@shown_errors
def audit(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.READ_AUDIT)],
    actor: Annotated[str | None, Query(max_length=250)] = None,
    action: Annotated[str | None, Query(max_length=100)] = None,
    since: Annotated[str | None, Query(max_length=40)] = None,
    before: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    """The audit log, newest first, filtered by actor, action and time (admins of every team)."""
    who = viewer(request)
    authorize(who.caller, Action.READ_AUDIT, team="*")
    since_at: datetime | None = None
    error = ""
    if since:
        try:
            since_at = datetime.fromisoformat(since)
            if since_at.tzinfo is None:
                since_at = since_at.replace(tzinfo=UTC)
        except ValueError:
            error = f"since: not a date and time: {since!r} (e.g. 2026-12-01T10:00)"
    entries = accounts.list_audit(
        db, since=since_at, actor=actor or None, action=action or None, before_id=before, limit=AUDIT_PAGE
    )
    older = entries[-1].id if len(entries) == AUDIT_PAGE else None
    return page(
        request,
        "audit.html",
        title="Audit log",
        entries=entries,
        actor=actor or "",
        action=action or "",
        since=since or "",
        error=error,
        older=older,
    )
