"""Attempt logs: pages by byte offset that a client follows while the attempt runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from treadle.api.deps import authorize, get_db, require
from treadle.api.guard import API, Caller
from treadle.api.routes.dags import dag_or_404
from treadle.domain.access import Action
from treadle.engine.log_pages import MAX_PAGE_BYTES, LogPage, dag_of_run, read_log_page
from treadle.store.database import Database

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]


@router.get(
    "/runs/{run_id}/tasks/{task_id}/logs",
    response_model=LogPage,
    responses={404: {"description": "No such run, task, or log file on this host"}},
)
def attempt_log(
    run_id: str,
    task_id: str,
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.READ_DAG)],
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    map_index: Annotated[int, Query(ge=-1, le=10_000_000)] = -1,
    offset: Annotated[int, Query(ge=0, le=2**50)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_BYTES)] = 64 * 1024,
) -> LogPage:
    """Up to `limit` bytes of an attempt's log (default: the latest attempt) from byte `offset`.

    To follow a running attempt, ask again from `next_offset` until `complete` is true. Logs are
    read from this API host's logs folder (TREADLE_LOGS_FOLDER): the attempt must have run here.
    """
    authorize(caller, Action.READ_DAG, team=dag_or_404(db, dag_of_run(db, run_id)).team)
    return read_log_page(
        db,
        run_id,
        task_id,
        logs_dir=request.app.state.logs_dir,
        attempt=attempt,
        map_index=map_index,
        offset=offset,
        limit=limit,
    )
