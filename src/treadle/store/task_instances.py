"""Queries on task instances: creation, claiming, guarded state changes, readiness counters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import DeadLetterReason, TaskState
from treadle.domain.task_records import AttemptRow, QueueFacts, TaskInstanceInfo
from treadle.domain.transitions import UseCase, task_sources
from treadle.store import dialects, limits
from treadle.store.limits import Candidate, Exclusions
from treadle.store.tables import UTCDateTime, dags
from treadle.store.tables import task_instances as ti

_INFO_COLUMNS = [ti.c[name] for name in TaskInstanceInfo.__dataclass_fields__]
#: What identifies an attempt and its retry budget (claims and the reaper read these).
_ATTEMPT_COLUMNS = (
    ti.c.id,
    ti.c.run_id,
    ti.c.dag_id,
    ti.c.task_id,
    ti.c.attempt,
    ti.c.budget_base,
    ti.c.orphaned_count,
    ti.c.map_index,
)
#: What a claim reads besides: its time (the heartbeat it stamps), when the instance became
#: ready, and the poke columns.
_CLAIM_COLUMNS = (ti.c.heartbeat_at, ti.c.queued_at, ti.c.first_poke_at, ti.c.poll_handle)


def stamp(now: datetime | None, *, plus: timedelta | None = None) -> Any:
    """The database time a statement writes (`+ plus`): `now`, read from the database, or when
    None PostgreSQL's `statement_timestamp()`, one value for every row of the statement.

    Hot-path statements pass None on PostgreSQL and RETURN the stamped column, which saves the
    separate clock query per transaction while keeping the database the only clock.
    """
    if now is None:
        expr = sa.func.statement_timestamp(type_=UTCDateTime())
        return expr if plus is None else expr + sa.literal(plus, sa.Interval())
    return sa.literal(now if plus is None else now + plus, UTCDateTime())


def insert_task_instances(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert the task instances of new runs (columns of `task_instances`; see insert_many)."""
    dialects.insert_many(conn, ti, rows)


def claim(
    conn: Connection,
    *,
    worker_id: str,
    hostname: str,
    queues: list[str],
    limit: int,
    start: int,
    now: datetime | None,
    lease_s: float,
    refused: Counter[str] | None = None,
) -> list[AttemptRow]:
    """Move up to `limit` queued task instances to running for this worker, highest priority first.

    Candidates are selected with `LIMIT ... FOR UPDATE SKIP LOCKED` (a plain SELECT, so the limit
    holds under concurrent claimers, F14), then admitted against pool slots and DAG
    `max_active_tasks` while the limit rows are locked (F15), then moved in one UPDATE. The
    first `start` are started (started_at and timeout_at stamped: they go to idle slots now);
    the rest are claimed for the worker's buffer, unstarted until `start_claimed_many`. `now` None
    stamps rows with the statement's database time (see `stamp`). `refused`, if given, is added
    the candidates that pool or DAG limits held back, by reason. Where the dialect has writable
    CTEs the first round is one statement (`_claim_at_once`) that takes the unlimited candidates
    itself and leaves the limited ones locked for admission.
    """
    claimed: list[AttemptRow] = []
    excluded = Exclusions()
    for round_ in range(2):  # a second round looks past candidates that a full pool held back
        if round_ == 0 and now is None and dialects.has_writable_ctes(conn):
            # One round trip takes the unlimited candidates; the limited ones it returns, still
            # locked, are admitted below (and, being limited, only ever claimed to start now).
            taken, candidates = _claim_at_once(
                conn,
                queues=queues,
                limit=limit,
                start=start,
                worker_id=worker_id,
                hostname=hostname,
                lease_s=lease_s,
            )
            claimed.extend(taken)
            starting = max(start - sum(1 for r in taken if r.started_at is not None), 0)
        else:
            candidates = _candidates(conn, queues=queues, limit=limit - len(claimed), skip=excluded)
            # Moved to running before any next round, so that round's usage counts them.
            starting = max(start - len(claimed), 0)
        admitted = limits.admit(conn, candidates, excluded)
        # A buffered attempt would hold its pool slot (or DAG allowance) while it waits: only
        # unlimited ones are claimed ahead; limited ones stay queued for a free slot anywhere.
        limited = {c.id for c in candidates if c.pool is not None or c.dag_limit is not None}
        ahead = [i for i in admitted[starting:] if i not in limited]
        for ids, started in ((admitted[:starting], True), (ahead, False)):
            claimed.extend(
                _take(
                    conn,
                    ids,
                    worker_id=worker_id,
                    hostname=hostname,
                    now=now,
                    lease_s=lease_s,
                    started=started,
                )
            )
        if len(claimed) >= limit or len(admitted) == len(candidates):
            break  # full, or nothing was held back that another round could look past
    if refused is not None:
        refused.update(excluded.refusals)
    return claimed


def _claim_at_once_statement() -> sa.TextualSelect:
    claimable = ", ".join(f"'{state}'" for state in task_sources(UseCase.CLAIM, TaskState.RUNNING))
    at = "statement_timestamp()"
    returned = ", ".join(f"t.{c.name}" for c in _TAKEN_COLUMNS)
    # The limited candidates' rows carry their id and DAG id; the other attempt columns are NULL.
    known = {"id": "n.id AS id", "dag_id": "n.dag_id AS dag_id"}
    padding = ", ".join(known.get(c.name, f"NULL AS {c.name}") for c in _TAKEN_COLUMNS)
    sql = f"""
WITH c AS (
    SELECT t.id, t.dag_id, t.pool, t.pool_slots, d.max_active_tasks AS dag_limit,
           t.priority_weight, t.queued_at AS ready_at
    FROM task_instances AS t LEFT OUTER JOIN dags AS d ON d.dag_id = t.dag_id
    WHERE t.state = '{TaskState.QUEUED.value}' AND t.queue IN :queues
    ORDER BY t.priority_weight DESC, t.queued_at, t.id
    LIMIT :limit
    FOR UPDATE OF t SKIP LOCKED
),
n AS (
    SELECT c.*, row_number() OVER (ORDER BY c.priority_weight DESC, c.ready_at, c.id) AS rank
    FROM c
),
u AS (
    UPDATE task_instances AS t
    SET state = '{TaskState.RUNNING.value}', attempt = t.attempt + 1, worker_id = :worker,
        hostname = :host,
        started_at = CASE WHEN n.rank <= :start THEN {at} END,
        ended_at = NULL,
        lease_expires_at = {at} + interval '1 second' * CAST(:lease AS DOUBLE PRECISION),
        heartbeat_at = {at},
        timeout_at = CASE WHEN n.rank <= :start THEN {at} + interval '1 second' * t.timeout_s END,
        next_attempt_at = NULL, dispatch_deadline = NULL
    FROM n
    WHERE t.id = n.id AND n.pool IS NULL AND n.dag_limit IS NULL
      AND {dialects.UNINDEXED_STATE} IN ({claimable})
    RETURNING n.rank, {returned}
)
SELECT 'taken' AS kind, u.rank, NULL AS pool, NULL AS pool_slots, NULL AS dag_limit,
       {", ".join(f"u.{c.name}" for c in _TAKEN_COLUMNS)}
FROM u
UNION ALL
SELECT 'limited', n.rank, n.pool, n.pool_slots, n.dag_limit, {padding}
FROM n WHERE n.pool IS NOT NULL OR n.dag_limit IS NOT NULL
ORDER BY 2
"""
    return (
        sa.text(sql)
        .bindparams(sa.bindparam("queues", expanding=True))
        .columns(
            sa.column("kind", sa.String()),
            sa.column("rank", sa.Integer()),
            sa.column("pool", sa.String()),
            sa.column("pool_slots", sa.Integer()),
            sa.column("dag_limit", sa.Integer()),
            *(sa.column(c.name, c.type) for c in _TAKEN_COLUMNS),
        )
    )


#: What a claim returns of each attempt it took (`_take` and `_claim_at_once`).
_TAKEN_COLUMNS = (ti.c.started_at, ti.c.timeout_s, *_ATTEMPT_COLUMNS, *_CLAIM_COLUMNS)


def _claim_at_once(
    conn: Connection,
    *,
    queues: list[str],
    limit: int,
    start: int,
    worker_id: str,
    hostname: str,
    lease_s: float,
) -> tuple[list[AttemptRow], list[Candidate]]:
    """The first claim round in one statement (where `dialects.has_writable_ctes`): lock up to
    `limit` queued candidates in claim order, skipping locked ones, and move those without a
    pool or DAG limit to running (the first `start` of the candidates started, the rest for the
    buffer); returns them and the limited candidates, still locked, for `limits.admit`."""
    stmt = dialects.built_once(conn, "claim at once", _claim_at_once_statement)
    params = {
        "queues": list(queues),
        "limit": limit,
        "start": start,
        "worker": worker_id,
        "host": hostname,
        "lease": lease_s,
    }
    taken: list[AttemptRow] = []
    limited: list[Candidate] = []
    names = [c.name for c in _TAKEN_COLUMNS]
    for r in conn.execute(stmt, params):
        if r.kind == "taken":
            taken.append(AttemptRow(**{n: r._mapping[n] for n in names}))
        else:
            limited.append(
                Candidate(
                    id=r.id, dag_id=r.dag_id, pool=r.pool, pool_slots=r.pool_slots, dag_limit=r.dag_limit
                )
            )
    return taken, limited


def _take_update(conn: Connection, *, started: bool, stamped: bool) -> sa.UpdateBase:
    """`_take`'s UPDATE ... RETURNING, built once per dialect and shape."""
    return dialects.built_once(conn, ("take", started, stamped), lambda: _build_take(conn, started, stamped))


def _build_take(conn: Connection, started: bool, stamped: bool) -> sa.UpdateBase:
    if stamped:
        at: Any = sa.bindparam("b_now", type_=UTCDateTime())
        expires: Any = sa.bindparam("b_expires", type_=UTCDateTime())
    else:
        at = stamp(None)
        expires = at + sa.bindparam("b_lease", type_=sa.Interval())
    stmt = (
        sa.update(ti)
        .where(
            ti.c.id.in_(sa.bindparam("b_ids", expanding=True)),
            dialects.unindexed(conn, ti.c.state).in_(task_sources(UseCase.CLAIM, TaskState.RUNNING)),
        )
        .values(
            state=TaskState.RUNNING.value,
            attempt=ti.c.attempt + 1,
            worker_id=sa.bindparam("b_worker"),
            hostname=sa.bindparam("b_host"),
            started_at=at if started else None,
            ended_at=None,
            lease_expires_at=expires,
            heartbeat_at=at,
            timeout_at=dialects.plus_seconds(conn, at, ti.c.timeout_s) if started else None,
            next_attempt_at=None,
            dispatch_deadline=None,
        )
        .returning(ti.c.started_at, ti.c.timeout_s, *_ATTEMPT_COLUMNS, *_CLAIM_COLUMNS)
    )
    return stmt


def _take(
    conn: Connection,
    ids: list[int],
    *,
    worker_id: str,
    hostname: str,
    now: datetime | None,
    lease_s: float,
    started: bool,
) -> list[AttemptRow]:
    if not ids:
        return []
    if dialects.has_update_returning(conn):  # one shape, built once per process
        params: dict[str, Any] = {"b_ids": list(ids), "b_worker": worker_id, "b_host": hostname}
        if now is None:
            params["b_lease"] = timedelta(seconds=lease_s)
        else:
            params["b_now"], params["b_expires"] = now, now + timedelta(seconds=lease_s)
        return _attempts(
            list(conn.execute(_take_update(conn, started=started, stamped=now is not None), params))
        )
    at = stamp(now)
    stmt = (
        sa.update(ti)
        .where(ti.c.id.in_(ids), ti.c.state.in_(task_sources(UseCase.CLAIM, TaskState.RUNNING)))
        .values(
            state=TaskState.RUNNING.value,
            attempt=ti.c.attempt + 1,
            worker_id=worker_id,
            hostname=hostname,
            started_at=at if started else None,
            ended_at=None,
            lease_expires_at=stamp(now, plus=timedelta(seconds=lease_s)),
            heartbeat_at=at,
            timeout_at=dialects.plus_seconds(conn, at, ti.c.timeout_s) if started else None,
            next_attempt_at=None,
            dispatch_deadline=None,
        )
    )
    rows = dialects.update_returning(
        conn, stmt, (ti.c.started_at, ti.c.timeout_s, *_ATTEMPT_COLUMNS, *_CLAIM_COLUMNS), key=ti.c.id
    )
    return _attempts(rows)


def start_claimed_many(
    conn: Connection, *, held: list[tuple[int, int]], worker_id: str, now: datetime | None
) -> dict[tuple[int, int], datetime]:
    """Start buffered attempts: stamp started_at and timeout_at of each (id, attempt) pair this
    worker still holds, unstarted, at that attempt, in one statement. Returns the start time of
    each pair moved; the others were cancelled, reaped or lost and must not run."""
    if not held:
        return {}
    if dialects.has_update_returning(conn):  # one shape, built once per process
        params: dict[str, Any] = {
            "b_ids": sorted({i for i, _ in held}),
            "b_held": [tuple(p) for p in held],
            "b_worker": worker_id,
        }
        if now is not None:
            params["b_now"] = now
        stmt = dialects.built_once(
            conn, ("start claimed", now is not None), lambda: _build_start_claimed(conn, now is not None)
        )
        return {(r.id, r.attempt): r.started_at for r in conn.execute(stmt, params)}
    at = stamp(now)
    stmt = (
        sa.update(ti)
        .where(
            ti.c.id.in_(sorted({i for i, _ in held})),
            sa.tuple_(ti.c.id, ti.c.attempt).in_(held),
            ti.c.worker_id == worker_id,
            ti.c.state == TaskState.RUNNING.value,
            ti.c.started_at.is_(None),
        )
        .values(started_at=at, timeout_at=dialects.plus_seconds(conn, at, ti.c.timeout_s))
    )
    rows = dialects.update_returning(conn, stmt, (ti.c.id, ti.c.attempt, ti.c.started_at), key=ti.c.id)
    return {(r.id, r.attempt): r.started_at for r in rows}


def _build_start_claimed(conn: Connection, stamped: bool) -> sa.UpdateBase:
    """`start_claimed_many`'s UPDATE ... RETURNING with bound parameters."""
    at = sa.bindparam("b_now", type_=UTCDateTime()) if stamped else stamp(None)
    return (
        sa.update(ti)
        .where(
            ti.c.id.in_(sa.bindparam("b_ids", expanding=True)),
            sa.tuple_(ti.c.id, ti.c.attempt).in_(
                sa.bindparam("b_held", expanding=True, type_=sa.TupleType(sa.BigInteger(), sa.Integer()))
            ),
            ti.c.worker_id == sa.bindparam("b_worker"),
            dialects.unindexed(conn, ti.c.state) == TaskState.RUNNING.value,
            ti.c.started_at.is_(None),
        )
        .values(started_at=at, timeout_at=dialects.plus_seconds(conn, at, ti.c.timeout_s))
        .returning(ti.c.id, ti.c.attempt, ti.c.started_at)
    )


def _candidates(conn: Connection, *, queues: list[str], limit: int, skip: Exclusions) -> list[Candidate]:
    if not (skip.ids or skip.pools or skip.dags):
        # The first round's shape (no exclusions yet) is built once per dialect.
        stmt = dialects.built_once(
            conn,
            "claim candidates",
            lambda: dialects.lock_for_claim(
                _candidate_select(
                    conn, queues=sa.bindparam("b_queues", expanding=True), limit=None, skip=skip
                ).limit(sa.bindparam("b_limit", type_=sa.Integer())),
                conn,
                of=ti,
            ),
        )
        rows = conn.execute(stmt, {"b_queues": list(queues), "b_limit": limit})
    else:
        sel = _candidate_select(conn, queues=queues, limit=limit, skip=skip)
        rows = conn.execute(dialects.lock_for_claim(sel, conn, of=ti))
    return [
        Candidate(
            id=r.id, dag_id=r.dag_id, pool=r.pool, pool_slots=r.pool_slots, dag_limit=r.max_active_tasks
        )
        for r in rows
    ]


def _candidate_select(conn: Connection, *, queues: Any, limit: int | None, skip: Exclusions) -> Any:
    source, dag_limit = dialects.claim_lookup(
        conn, ti, dags.c.max_active_tasks, on=dags.c.dag_id == ti.c.dag_id
    )
    sel = (
        sa.select(ti.c.id, ti.c.dag_id, ti.c.pool, ti.c.pool_slots, dag_limit)
        .select_from(source)
        # The state is written into the SQL, not bound: a prepared statement's generic plan must
        # still see that it matches the partial claim-order index (queued rows only).
        .where(ti.c.state == sa.literal(TaskState.QUEUED.value, literal_execute=True), ti.c.queue.in_(queues))
        .order_by(ti.c.priority_weight.desc(), ti.c.queued_at, ti.c.id)
        .limit(limit)
    )
    if skip.ids:
        sel = sel.where(ti.c.id.not_in(sorted(skip.ids)))
    if skip.pools:
        sel = sel.where(sa.or_(ti.c.pool.is_(None), ti.c.pool.not_in(sorted(skip.pools))))
    if skip.dags:
        sel = sel.where(ti.c.dag_id.not_in(sorted(skip.dags)))
    return sel


def hand_back(
    conn: Connection, *, task_instance_id: int, attempt: int, worker_id: str, now: datetime
) -> bool:
    """running -> queued for an attempt this worker gives up unfinished, without spending a retry.

    The attempt number stays consumed (it is the fence), so the retry budget moves with it.
    """
    stmt = _guard(
        sa.update(ti).values(
            state=TaskState.QUEUED.value,
            budget_base=ti.c.budget_base + 1,
            worker_id=None,
            lease_expires_at=None,
            timeout_at=None,
            queued_at=now,
            dispatch_deadline=dialects.plus_seconds(conn, stamp(now), ti.c.queue_timeout_s),
        ),
        sources=task_sources(UseCase.HAND_BACK, TaskState.QUEUED),
        task_instance_id=task_instance_id,
        attempt=attempt,
        worker_id=worker_id,
        lease_expired_before=None,
        timeout_before=None,
    )
    return bool(conn.execute(stmt).rowcount)


def end_queued(
    conn: Connection,
    *,
    task_instance_id: int,
    attempt: int,
    new_state: TaskState,
    now: datetime,
    deadline_before: datetime,
    next_attempt_at: datetime | None,
    dead_letter_reason: str | None,
) -> bool:
    """Compare-and-set queued -> `new_state` once the dispatch deadline passed, consuming `attempt`.

    `attempt` is the number of the attempt that never started (the row is at `attempt - 1`).
    """
    stmt = (
        sa.update(ti)
        .where(
            ti.c.id == task_instance_id,
            ti.c.state.in_(task_sources(UseCase.DISPATCH_TIMEOUT, new_state)),
            ti.c.attempt == attempt - 1,
            ti.c.dispatch_deadline < deadline_before,
        )
        .values(
            state=new_state.value,
            attempt=attempt,
            ended_at=now,
            next_attempt_at=next_attempt_at,
            dead_letter_reason=dead_letter_reason,
            dispatch_deadline=None,
        )
    )
    return bool(conn.execute(stmt).rowcount)


def _attempts(rows: Any) -> list[AttemptRow]:  # Any: an iterable of Rows
    return [AttemptRow(**r._mapping) for r in rows]


def expired_dispatch(conn: Connection, *, now: datetime, limit: int) -> list[AttemptRow]:
    """Queued task instances past their dispatch deadline (the reaper's evidence)."""
    stmt = (
        sa.select(
            *_ATTEMPT_COLUMNS, ti.c.queue, ti.c.pool, ti.c.pool_slots, ti.c.queued_at, ti.c.dispatch_deadline
        )
        .where(ti.c.state == TaskState.QUEUED.value, ti.c.dispatch_deadline < now)
        .order_by(ti.c.dispatch_deadline)
        .limit(limit)
    )
    return _attempts(conn.execute(stmt))


def overdue_running(conn: Connection, *, before: datetime, limit: int) -> list[AttemptRow]:
    """Running task instances whose execution deadline passed before `before`."""
    stmt = (
        sa.select(*_ATTEMPT_COLUMNS, ti.c.worker_id, ti.c.hostname, ti.c.started_at, ti.c.timeout_at)
        .where(ti.c.state == TaskState.RUNNING.value, ti.c.timeout_at < before)
        .order_by(ti.c.timeout_at)
        .limit(limit)
    )
    return _attempts(conn.execute(stmt))


def _guard(
    stmt: sa.Update,
    *,
    sources: tuple[str, ...],
    task_instance_id: int,
    attempt: int,
    worker_id: str | None,
    lease_expired_before: datetime | None,
    timeout_before: datetime | None,
) -> sa.Update:
    stmt = stmt.where(ti.c.id == task_instance_id, ti.c.state.in_(sources), ti.c.attempt == attempt)
    if worker_id is not None:
        stmt = stmt.where(ti.c.worker_id == worker_id)
    if lease_expired_before is not None:
        stmt = stmt.where(ti.c.lease_expires_at < lease_expired_before)
    if timeout_before is not None:
        stmt = stmt.where(ti.c.timeout_at < timeout_before)
    return stmt


def end_running(
    conn: Connection,
    *,
    task_instance_id: int,
    attempt: int,
    new_state: TaskState,
    by: UseCase,
    now: datetime,
    worker_id: str | None = None,
    lease_expired_before: datetime | None = None,
    timeout_before: datetime | None = None,
    next_attempt_at: datetime | None = None,
    dead_letter_reason: str | None = None,
    orphaned: bool = False,
    forget_poll_state: bool = False,
) -> bool:
    """Compare-and-set running -> `new_state` for one attempt, an edge `by` may take; False if
    another party moved it.

    `worker_id` fences a worker's report; `lease_expired_before` / `timeout_before` fence the
    reaper (the lease or the execution deadline must really have passed). `forget_poll_state`
    drops a submitted job's handle and first poke (the job ended: a retry submits anew).
    """
    values: dict[str, Any] = {
        "state": new_state.value,
        "ended_at": now,
        "lease_expires_at": None,
        "next_attempt_at": next_attempt_at,
        "dead_letter_reason": dead_letter_reason,
    }
    if orphaned:
        values["orphaned_count"] = ti.c.orphaned_count + 1
    if forget_poll_state:
        values.update(poll_handle=sa.null(), first_poke_at=None)
    stmt = _guard(
        sa.update(ti).values(**values),
        sources=task_sources(by, new_state),
        task_instance_id=task_instance_id,
        attempt=attempt,
        worker_id=worker_id,
        lease_expired_before=lease_expired_before,
        timeout_before=timeout_before,
    )
    return bool(conn.execute(stmt).rowcount)


def _end_running_update(conn: Connection, *, new_state: TaskState, stamped: bool) -> sa.UpdateBase:
    """`end_running_many`'s UPDATE ... RETURNING, built once per dialect and shape."""
    return dialects.built_once(
        conn, ("end running", new_state, stamped), lambda: _build_end_running(new_state, stamped)
    )


def _build_end_running(new_state: TaskState, stamped: bool) -> sa.UpdateBase:
    now = sa.bindparam("b_now", type_=UTCDateTime()) if stamped else stamp(None)
    stmt = (
        sa.update(ti)
        .where(
            ti.c.id.in_(sa.bindparam("b_ids", expanding=True)),
            sa.tuple_(ti.c.id, ti.c.attempt).in_(
                sa.bindparam("b_held", expanding=True, type_=sa.TupleType(sa.BigInteger(), sa.Integer()))
            ),
            ti.c.state.in_(task_sources(UseCase.COMPLETE, new_state)),
            ti.c.worker_id == sa.bindparam("b_worker"),
        )
        .values(
            state=new_state.value,
            ended_at=now,
            lease_expires_at=None,
            next_attempt_at=None,
            dead_letter_reason=None,
        )
        .returning(ti.c.id, ti.c.attempt, ti.c.ended_at)
    )
    return stmt


def end_running_many(
    conn: Connection,
    *,
    held: list[tuple[int, int]],
    new_state: TaskState,
    worker_id: str,
    now: datetime | None,
) -> dict[tuple[int, int], datetime]:
    """Compare-and-set running -> `new_state` for several attempts this worker holds, in one statement.

    Each row must still be running at the named attempt under `worker_id` (the fence); returns
    the (id, attempt) pairs that moved, with the `ended_at` written. The rest were lost.
    """
    if not held:
        return {}
    if dialects.has_update_returning(conn):  # one shape, built once per process
        params: dict[str, Any] = {
            "b_ids": sorted({i for i, _ in held}),
            "b_held": [tuple(p) for p in held],
            "b_worker": worker_id,
        }
        if now is not None:
            params["b_now"] = now
        stmt = _end_running_update(conn, new_state=new_state, stamped=now is not None)
        return {(r.id, r.attempt): r.ended_at for r in conn.execute(stmt, params)}
    stmt = (
        sa.update(ti)
        .where(
            # `id IN` first lets every planner (SQLite's included) look rows up by primary key
            # rather than scanning all running rows; the (id, attempt) pair is the fence.
            ti.c.id.in_(sorted({i for i, _ in held})),
            sa.tuple_(ti.c.id, ti.c.attempt).in_(held),
            ti.c.state.in_(task_sources(UseCase.COMPLETE, new_state)),
            ti.c.worker_id == worker_id,
        )
        .values(
            state=new_state.value,
            ended_at=stamp(now),
            lease_expires_at=None,
            next_attempt_at=None,
            dead_letter_reason=None,
        )
    )
    rows = dialects.update_returning(conn, stmt, (ti.c.id, ti.c.attempt, ti.c.ended_at), key=ti.c.id)
    return {(r.id, r.attempt): r.ended_at for r in rows}


def _upstream_set(conn: Connection, n: Any, now: Any) -> list[tuple[Any, Any]]:
    """SET list of `count_upstream_successes` (its order matters on MySQL: see there)."""
    waiting = task_sources(UseCase.READY, TaskState.QUEUED)
    ready = sa.and_(ti.c.state.in_(waiting), ti.c.upstream_done + n >= ti.c.upstream_total)
    return [
        (ti.c.queued_at, sa.case((ready, now), else_=ti.c.queued_at)),
        (
            ti.c.dispatch_deadline,
            sa.case(
                (ready, dialects.plus_seconds(conn, now, ti.c.queue_timeout_s)),
                else_=ti.c.dispatch_deadline,
            ),
        ),
        (ti.c.state, sa.case((ready, TaskState.QUEUED.value), else_=ti.c.state)),
        (ti.c.upstream_done, ti.c.upstream_done + n),
    ]


def _upstream_update(conn: Connection, *, stamped: bool) -> sa.UpdateBase:
    """`count_upstream_successes`'s UPDATE ... RETURNING, built once per dialect and shape."""
    return dialects.built_once(conn, ("upstream", stamped), lambda: _build_upstream(conn, stamped))


def _build_upstream(conn: Connection, stamped: bool) -> sa.UpdateBase:
    now = sa.bindparam("b_now", type_=UTCDateTime()) if stamped else stamp(None)
    stmt = (
        sa.update(ti)
        .where(
            ti.c.run_id == sa.bindparam("b_run_id"),
            ti.c.task_id.in_(sa.bindparam("b_task_ids", expanding=True)),
        )
        .ordered_values(*_upstream_set(conn, sa.bindparam("b_n", type_=sa.Integer()), now))
        .returning(ti.c.state, ti.c.queue)
    )
    return stmt


def _upstream_update_for(
    conn: Connection, run_id: str, task_ids: list[str], n: int, now: datetime | None
) -> sa.Update:
    return (
        sa.update(ti)
        .where(ti.c.run_id == run_id, ti.c.task_id.in_(sorted(task_ids)))
        .ordered_values(*_upstream_set(conn, n, stamp(now)))
    )


def count_upstream_successes(
    conn: Connection,
    *,
    increments: Mapping[tuple[str, str], int],
    now: datetime | None,
    queues: set[str] | None = None,
) -> set[str]:
    """Add succeeded upstreams to downstream counters and queue the rows that became ready.

    `increments` maps (run id, downstream task id) to how many of its upstreams just succeeded.
    Counter and state move in the same UPDATE (SET expressions read the row's old values), so
    a fan-in row is queued exactly by the completion that fills its counter; concurrent
    completions serialise on the row lock and re-read it. Returns the runs in which a row was
    queued; `queues`, if given, collects the queues of the rows queued.
    MySQL evaluates SET left to right, each seeing the columns already assigned, so the SET
    order is fixed: columns that read `state` and `upstream_done` come before those two.
    """
    groups: dict[tuple[str, int], list[str]] = {}
    for (run_id, task_id), n in increments.items():
        groups.setdefault((run_id, n), []).append(task_id)
    queued: set[str] = set()
    for (run_id, n), task_ids in sorted(groups.items()):
        if dialects.has_update_returning(conn):  # one shape, built once per process
            params = {"b_run_id": run_id, "b_task_ids": sorted(task_ids), "b_n": n}
            if now is not None:
                params["b_now"] = now
            rows = list(conn.execute(_upstream_update(conn, stamped=now is not None), params))
        else:
            rows = dialects.update_returning(
                conn,
                _upstream_update_for(conn, run_id, task_ids, n, now),
                (ti.c.state, ti.c.queue),
                key=ti.c.id,
            )
        for r in rows:
            if r.state == TaskState.QUEUED.value:
                queued.add(run_id)
                if queues is not None:
                    queues.add(r.queue)
    return queued


def reset_to_pending(conn: Connection, *, run_id: str, task_ids: list[str]) -> int:
    """Move upstream_failed task instances of a run back to pending (after a requeue)."""
    if not task_ids:
        return 0
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.run_id == run_id,
            ti.c.task_id.in_(task_ids),
            ti.c.state.in_(task_sources(UseCase.REQUEUE, TaskState.PENDING)),
        )
        .values(state=TaskState.PENDING.value, ended_at=None)
    )
    return int(result.rowcount)


def resolve_inspection(
    conn: Connection, *, task_instance_id: int, attempt: int, new_state: TaskState, now: datetime
) -> bool:
    """needs_inspection -> success or dead_letter (resolved by an operator) for the attempt that
    asked for inspection; False if the instance moved meanwhile."""
    reason = DeadLetterReason.RESOLVED_FAILED.value if new_state is TaskState.DEAD_LETTER else None
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.id == task_instance_id,
            ti.c.attempt == attempt,
            ti.c.state.in_(task_sources(UseCase.RESOLVE, new_state)),
        )
        .values(state=new_state.value, ended_at=now, dead_letter_reason=reason)
    )
    return bool(result.rowcount)


def requeue_dead_letter(
    conn: Connection, *, task_instance_id: int, now: datetime, by: UseCase = UseCase.REQUEUE
) -> bool:
    """dead_letter -> queued with a fresh retry budget (or, `by` RESOLVE, needs_inspection ->
    queued); False if it is no longer in a state `by` moves."""
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.id == task_instance_id, ti.c.state.in_(task_sources(by, TaskState.QUEUED)))
        .values(
            state=TaskState.QUEUED.value,
            queued_at=now,
            dispatch_deadline=dialects.plus_seconds(conn, stamp(now), ti.c.queue_timeout_s),
            **requeue_reset(),
        )
    )
    return bool(result.rowcount)


def requeue_reset() -> dict[str, Any]:
    """The columns a requeue resets, whichever state it moves the instance to: a fresh retry
    budget, no end, no worker, and the poke state forgotten."""
    return {
        "budget_base": ti.c.attempt,
        "orphaned_count": 0,
        "dead_letter_reason": None,
        "ended_at": None,
        "worker_id": None,
        # A requeued sensor waits afresh; a requeued submit-then-poll task submits anew.
        "first_poke_at": None,
        "poll_handle": sa.null(),
    }


def promote_due_retries(conn: Connection, *, now: datetime, limit: int = 1000) -> int:
    """retry_wait and up_for_reschedule -> queued for every task instance whose next attempt
    (or next poke) is due."""
    waiting = task_sources(UseCase.PROMOTE_RETRY, TaskState.QUEUED)
    due = sa.select(ti.c.id).where(ti.c.state.in_(waiting), ti.c.next_attempt_at <= now).limit(limit)
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.id.in_(dialects.limited_keys(conn, due)), ti.c.state.in_(waiting))
        .values(
            state=TaskState.QUEUED.value,
            queued_at=now,
            next_attempt_at=None,
            dispatch_deadline=dialects.plus_seconds(conn, stamp(now), ti.c.queue_timeout_s),
        )
    )
    return int(result.rowcount)


def lock_unless_held(conn: Connection, task_instance_id: int) -> bool:
    """Lock a task instance's row for this transaction; False, at once, if another holds it."""
    stmt = dialects.lock_for_claim(sa.select(ti.c.id).where(ti.c.id == task_instance_id), conn)
    return conn.execute(stmt).first() is not None


def expired_leases(conn: Connection, *, now: datetime, limit: int) -> list[AttemptRow]:
    """Return running task instances whose lease has expired (the reaper's evidence)."""
    stmt = (
        sa.select(
            *_ATTEMPT_COLUMNS,
            ti.c.worker_id,
            ti.c.hostname,
            ti.c.started_at,
            ti.c.lease_expires_at,
            ti.c.heartbeat_at,
            ti.c.timeout_at,
        )
        .where(ti.c.state == TaskState.RUNNING.value, ti.c.lease_expires_at < now)
        .order_by(ti.c.lease_expires_at)
        .limit(limit)
    )
    return _attempts(conn.execute(stmt))


def extend_leases(
    conn: Connection, *, worker_id: str, held: list[tuple[int, int]], now: datetime, lease_s: float
) -> tuple[set[tuple[int, int]], set[int]]:
    """Extend the leases this worker still holds. Returns the (id, attempt) pairs renewed, and
    the ids skipped because another transaction held their row (the worker's own dispatch pass
    starting or recording them, or a cancel under way): neither renewed nor lost this time.

    Rows are locked in id order and locked rows are skipped, never waited for, so a renewal can
    neither deadlock with a pass that changes several of the worker's rows in its own order nor
    stall behind it; the worker retries skipped rows soon after.

    Only rows this worker still runs are locked: a stale worker (one cut off past its lease,
    whose renewal reaches the server late) must not hold the row of the attempt that replaced
    its own, or that attempt's worker would skip its renewal and, skipping long enough, fence.
    """
    if not held:
        return set(), set()
    ids = sorted({i for i, _ in held})
    ours = sa.and_(
        ti.c.id.in_(ids),
        ti.c.worker_id == worker_id,
        dialects.unindexed(conn, ti.c.state) == TaskState.RUNNING.value,
    )
    skipped: set[int] = set()
    if dialects.locks_rejected_rows(conn):
        # Find ours with a plain read (the last committed versions, no wait), then lock only
        # those.
        mine = [r.id for r in conn.execute(sa.select(ti.c.id).where(ours).order_by(ti.c.id))]
        if not mine:
            return set(), set()
        lock = dialects.lock_for_claim(sa.select(ti.c.id).where(ti.c.id.in_(mine)).order_by(ti.c.id), conn)
        locked = [r.id for r in conn.execute(lock)]
        skipped = set(mine) - set(locked)
    else:
        # (SQLite: a plain read; its single writer lock serialises transactions.)
        lock = dialects.lock_for_claim(sa.select(ti.c.id).where(ours).order_by(ti.c.id), conn, of=ti)
        locked = [r.id for r in conn.execute(lock)]
        if len(locked) < len(ids):
            # Not locked: no longer ours, or ours but held by another transaction. A plain
            # read (the last committed version, no wait) tells which.
            rest = sa.select(ti.c.id).where(ours, ti.c.id.not_in(locked))
            skipped = {r.id for r in conn.execute(rest)}
    if not locked:
        return set(), skipped
    stmt = (
        sa.update(ti)
        .where(
            ti.c.id.in_(locked),
            ti.c.worker_id == worker_id,
            dialects.unindexed(conn, ti.c.state) == TaskState.RUNNING.value,
        )
        .values(lease_expires_at=now + timedelta(seconds=lease_s), heartbeat_at=now)
    )
    rows = dialects.update_returning(conn, stmt, (ti.c.id, ti.c.attempt), key=ti.c.id)
    renewed = {(r.id, r.attempt) for r in rows}
    return renewed & set(held), skipped


def get_task_instance(conn: Connection, task_instance_id: int) -> TaskInstanceInfo | None:
    """Return one task instance, or None."""
    row = conn.execute(sa.select(*_INFO_COLUMNS).where(ti.c.id == task_instance_id)).first()
    return TaskInstanceInfo(**row._mapping) if row else None


def get_queue_facts(conn: Connection, task_instance_id: int) -> QueueFacts:
    """Queue, pool and pool slots of one task instance (what admission depends on)."""
    row = conn.execute(
        sa.select(ti.c.queue, ti.c.pool, ti.c.pool_slots).where(ti.c.id == task_instance_id)
    ).one()
    return QueueFacts(**row._mapping)


def list_for_run(conn: Connection, run_id: str) -> list[TaskInstanceInfo]:
    """Return every task instance of a run."""
    rows = conn.execute(sa.select(*_INFO_COLUMNS).where(ti.c.run_id == run_id).order_by(ti.c.id))
    return [TaskInstanceInfo(**r._mapping) for r in rows]


def list_dead_letters(conn: Connection, *, limit: int) -> list[TaskInstanceInfo]:
    """Return dead-lettered task instances, newest first."""
    rows = conn.execute(
        sa.select(*_INFO_COLUMNS)
        .where(ti.c.state == TaskState.DEAD_LETTER.value)
        .order_by(ti.c.ended_at.desc())
        .limit(limit)
    )
    return [TaskInstanceInfo(**r._mapping) for r in rows]


def find_task_instance(
    conn: Connection, *, run_id: str, task_id: str, map_index: int = -1
) -> TaskInstanceInfo | None:
    """Return the task instance of a run's task (and map index), or None."""
    row = conn.execute(
        sa.select(*_INFO_COLUMNS).where(
            ti.c.run_id == run_id, ti.c.task_id == task_id, ti.c.map_index == map_index
        )
    ).first()
    return TaskInstanceInfo(**row._mapping) if row else None


def list_in_state(conn: Connection, state: TaskState, *, limit: int) -> list[TaskInstanceInfo]:
    """Return task instances in one state, the longest there first (by when their attempt ended)."""
    rows = conn.execute(
        sa.select(*_INFO_COLUMNS)
        .where(ti.c.state == state.value)
        .order_by(ti.c.ended_at, ti.c.id)
        .limit(limit)
    )
    return [TaskInstanceInfo(**r._mapping) for r in rows]
