"""Claiming attempts and recording how they end, each fenced by worker id and attempt number."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.fingerprint import fingerprint
from treadle.domain.lineage import LineageEventType
from treadle.domain.outbox import OutboxKind
from treadle.domain.records import RunInfo
from treadle.domain.retry import FailurePlan, RetryDecision, plan_failure
from treadle.domain.sensing import SensorSpec, next_poke_at
from treadle.domain.states import AttemptOutcome, TaskState
from treadle.domain.task_records import AttemptDetails, AttemptError, AttemptRow, ClaimedTask
from treadle.domain.transitions import ending_use_case
from treadle.engine import lineage, outbox
from treadle.engine.datasets import OutletEvent, outlet_event_rows, record_outlet_events
from treadle.engine.mapping import claim_inputs
from treadle.engine.propagation import FollowUp, after_dead_letter, after_success, deliver
from treadle.engine.runs import close_run_if_done
from treadle.engine.versions import version_of
from treadle.store import attempts as attempt_store
from treadle.store import dialects
from treadle.store import pokes as poke_store
from treadle.store import runs as run_store
from treadle.store import successes as success_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.engine")

MAX_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending:
    """How a worker's report was taken: applied, or discarded because the attempt was lost."""

    applied: bool
    decision: RetryDecision | None = None


def claim_task_instances(
    db: Database,
    *,
    worker_id: str,
    hostname: str,
    queues: list[str],
    limit: int,
    lease_s: float,
    start: int | None = None,
) -> list[ClaimedTask]:
    """Claim up to `limit` queued task instances and gather what running them needs.

    The first `start` (default: all) are started at once, for idle slots; the rest are claimed
    unstarted for the worker's buffer (`started_at` None) and started by `start_claimed`.
    """
    if limit <= 0:
        return []
    return db.transact(
        lambda conn: _claim_in(
            db,
            conn,
            worker_id=worker_id,
            hostname=hostname,
            queues=queues,
            limit=limit,
            start=limit if start is None else start,
            lease_s=lease_s,
        )
    )


def _claim_in(
    db: Database,
    conn: Connection,
    *,
    worker_id: str,
    hostname: str,
    queues: list[str],
    limit: int,
    start: int,
    lease_s: float,
    known: Mapping[tuple[str, str], Any] | None = None,
    refused: Counter[str] | None = None,
) -> list[ClaimedTask]:
    """The claim of `claim_task_instances`, inside the caller's transaction (`known`: upstream
    results already at hand, by (run id, task id); `refused` counts what limits held back)."""
    known = known or {}
    if limit <= 0:
        return []
    rows = ti_store.claim(
        conn,
        worker_id=worker_id,
        hostname=hostname,
        queues=queues,
        limit=limit,
        start=start,
        now=dialects.statement_clock(conn),
        lease_s=lease_s,
        refused=refused,
    )
    if not rows:
        return []
    runs = _runs(db, conn, {r.run_id for r in rows})
    inputs = claim_inputs(db, conn, rows, {r: run.dag_version_id for r, run in runs.items()}, known)
    claimed = [
        attempt_of(
            r,
            runs[r.run_id],
            started_at=r.started_at,
            upstream_results=upstream,
            map_item=item,
            claimed_at=r.heartbeat_at,
        )
        for r, (upstream, item) in zip(rows, inputs, strict=True)
    ]
    lineage.attempts_started(db, conn, claimed)
    return claimed


@dataclass(frozen=True, slots=True, kw_only=True)
class Cycle:
    """What one round trip of a worker's dispatch loop did (see `work_cycle`)."""

    #: How each success was taken, in the order given.
    endings: list[Ending]
    #: Each buffered attempt asked to start, with its start time, or None if it must not run.
    started: list[ClaimedTask | None]
    #: Newly claimed attempts; the first `claim_start` of them are started.
    claimed: list[ClaimedTask]
    #: How each poke's reschedule was taken, in the order given.
    rescheduled: list[Ending] = field(default_factory=list)
    #: Queued candidates the claim left behind because a pool or DAG limit was full, by reason.
    refused: Counter[str] = field(default_factory=Counter)
    #: Queues in which the recorded successes readied downstream work (claimed here or not).
    readied_queues: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Reschedule:
    """A poke that found its condition unmet (or its job still running): record the attempt
    `rescheduled` and schedule the next poke."""

    task: ClaimedTask
    #: A sensor's state or a submitted job's handle, for the next poke. Any: JSON.
    state: Any
    #: What the poke saw, recorded as the attempt's outputs.
    evidence: dict[str, Any] | None = None
    code_version: str | None = None
    #: As the poke's request carried it (None on the first poke: this one's start).
    first_poke_at: datetime | None = None
    #: The poke submitted an external job: if the reschedule is refused, nobody will poll the
    #: job, and a worker owes its cancel.
    submitted: bool = False


def work_cycle(
    db: Database,
    *,
    successes: Sequence[Success],
    start: Sequence[ClaimedTask],
    claim_limit: int,
    claim_start: int,
    worker_id: str,
    hostname: str,
    queues: list[str],
    lease_s: float,
    reschedules: Sequence[Reschedule] = (),
    attempts: int = 8,
    busy_runs: frozenset[str] = frozenset(),
) -> Cycle:
    """One transaction of the worker's hot path: start buffered attempts for idle slots, record
    its slots' successes and pokes' reschedules, and claim more, in that order.

    Recording before claiming lets the claim take what the successes just readied (the next
    task of a chain goes out in the same transaction that recorded its upstream). Each part is
    fenced as on its own (`start_claimed`, `complete_attempts`, `claim_task_instances`). Lock
    order stays task instances, then runs: the starts lock only this worker's rows, and the
    claim skips locked rows, never waiting on one. `busy_runs`: runs in which the caller holds
    another active attempt, which the successes therefore cannot have ended (no close probe).
    """

    def work(conn: Connection) -> Cycle:
        # Several of this worker's rows change here, in each statement's own order: the
        # heartbeat skips rows a pass holds instead of waiting (`extend_leases`), so the two
        # cannot deadlock, and the pass takes no extra round trip to lock them in id order.
        started = _start_in(db, conn, start, worker_id=worker_id)
        # An attempt can finish before its start is recorded (a slot ran it straight from the
        # buffer): its attempt row takes the start time just written.
        begun = {(t.task_instance_id, t.attempt): t for t in started if t is not None}
        items = [
            (begun.get((t.task_instance_id, t.attempt), t) if t.started_at is None else t, v, o, x)
            for t, v, o, x in (_unpack(d) for d in successes)
        ]
        done = _complete_in(
            db, conn, items, worker_id=worker_id, hostname=hostname, defer_notify=True, busy_runs=busy_runs
        )
        rescheduled = _reschedule_all(
            db,
            conn,
            [
                replace(r, task=begun.get((r.task.task_instance_id, r.task.attempt), r.task))
                if r.task.started_at is None
                else r
                for r in reschedules
            ],
            worker_id=worker_id,
            hostname=hostname,
        )
        refused: Counter[str] = Counter()
        claimed = _claim_in(
            db,
            conn,
            worker_id=worker_id,
            hostname=hostname,
            queues=queues,
            limit=claim_limit,
            start=claim_start,
            lease_s=lease_s,
            known=done.values,
            refused=refused,
        )
        # Other workers hear of readied work only if some may be left for them: a claim that came
        # back short took (or could not admit) everything queued that this transaction could see
        # in the queues it serves.
        if done.readied_queues and (len(claimed) >= claim_limit or not done.readied_queues <= set(queues)):
            dialects.notify_ready(conn)
        return Cycle(
            endings=done.endings,
            started=started,
            claimed=claimed,
            rescheduled=rescheduled,
            refused=refused,
            readied_queues=done.readied_queues,
        )

    return db.transact(work, attempts=attempts)


def _start_in(
    db: Database, conn: Connection, tasks: Sequence[ClaimedTask], *, worker_id: str
) -> list[ClaimedTask | None]:
    if not tasks:
        return []
    begun = ti_store.start_claimed_many(
        conn,
        held=[(t.task_instance_id, t.attempt) for t in tasks],
        worker_id=worker_id,
        now=dialects.statement_clock(conn),
    )
    started = [
        None if (at := begun.get((t.task_instance_id, t.attempt))) is None else replace(t, started_at=at)
        for t in tasks
    ]
    lineage.attempts_started(db, conn, started)
    return started


def start_claimed(db: Database, task: ClaimedTask, *, worker_id: str) -> ClaimedTask | None:
    """Start a buffered attempt, re-checking in the same statement that this worker still holds
    it: the attempt with its start time, or None if it was cancelled, reaped or lost meanwhile
    (it must not run). The same guarded statement a dispatch pass uses (`work_cycle`)."""
    return db.transact(lambda conn: _start_in(db, conn, [task], worker_id=worker_id))[0]


def attempt_of(
    row: AttemptRow,
    run: RunInfo,
    *,
    started_at: datetime | None,
    upstream_results: dict[str, Any] | None = None,
    map_item: Any = None,
    claimed_at: datetime | None = None,
) -> ClaimedTask:
    """The attempt that a task instance row (claim or lease columns) and its run describe;
    `claimed_at` for a row a claim just read."""
    return ClaimedTask(
        task_instance_id=row.id,
        run_id=row.run_id,
        dag_id=row.dag_id,
        task_id=row.task_id,
        attempt=row.attempt,
        budget_base=row.budget_base,
        orphaned_count=row.orphaned_count,
        dag_version_id=run.dag_version_id,
        logical_date=run.logical_date,
        started_at=started_at,
        timeout_s=row.timeout_s,
        conf=run.params if run.params is not None else run.conf,
        manifest=run.manifest or {},
        upstream_results=upstream_results or {},
        map_index=row.map_index,
        map_item=map_item,
        claimed_at=claimed_at,
        first_poke_at=row.first_poke_at,
        poll_state=row.poll_handle,
        queued_at=row.queued_at,
    )


#: Most runs a worker remembers; past it the cache starts over (a re-read is one query).
_RUN_CACHE_LIMIT = 1_000


def _runs(db: Database, conn: Connection, run_ids: set[str]) -> dict[str, RunInfo]:
    """Runs by id for claimed rows, from the database's run cache where possible.

    Only fields fixed when the run is created (version, logical date, conf) are read from the
    cached value, so an entry never goes stale; it saves a query on nearly every claim.
    """
    cache = db.run_cache
    missing = sorted(r for r in run_ids if r not in cache)
    if missing:
        if len(cache) + len(missing) > _RUN_CACHE_LIMIT:
            cache.clear()
        cache.update(run_store.runs_for_versions(conn, missing))
    return {r: cache[r] for r in run_ids}


#: One success to record: (attempt, result), optionally with its outlet annotations by dataset
#: and what it reported besides (exit code, code version, structured outputs).
Success = (
    tuple[ClaimedTask, Any]
    | tuple[ClaimedTask, Any, Mapping[str, OutletEvent]]
    | tuple[ClaimedTask, Any, Mapping[str, OutletEvent], AttemptDetails]
)
_Item = tuple[ClaimedTask, Any, Mapping[str, OutletEvent], AttemptDetails]
_NO_DETAILS = AttemptDetails()


def _unpack(item: Success) -> _Item:
    if len(item) == 4:
        return item
    if len(item) == 3:
        return item[0], item[1], item[2], _NO_DETAILS
    return item[0], item[1], {}, _NO_DETAILS


def complete_attempts(
    db: Database, done: Sequence[Success], *, worker_id: str, hostname: str
) -> list[Ending]:
    """Record several successes of this worker in one transaction, in a handful of statements.

    Per attempt it is the same as `complete_attempt`: a compare-and-set fenced by worker id and
    attempt (one UPDATE for the batch), the attempt row, the result, the dataset events of its
    outlets, the downstream counters, NOTIFY, and closing a run that readied nothing. Attempts the
    worker lost are discarded, not applied. Returns one Ending per item, in order.
    """
    if not done:
        return []
    items = [_unpack(d) for d in done]
    return db.transact(
        lambda conn: _complete_in(db, conn, items, worker_id=worker_id, hostname=hostname).endings
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Completed:
    endings: list[Ending]
    #: Queues of the downstream task instances that became ready (the NOTIFY is the caller's if
    #: deferred).
    readied_queues: frozenset[str] = frozenset()
    #: The results just stored, by (run id, task id): a claim in the same transaction reads them
    #: from here instead of the table.
    values: dict[tuple[str, str], Any] = field(default_factory=dict)


def _complete_in(
    db: Database,
    conn: Connection,
    items: list[_Item],
    *,
    worker_id: str,
    hostname: str,
    defer_notify: bool = False,
    busy_runs: frozenset[str] = frozenset(),
) -> _Completed:
    """The body of `complete_attempts`, inside the caller's transaction (`busy_runs`: see
    `work_cycle`)."""
    if not items:
        return _Completed(endings=[])
    now = dialects.statement_clock(conn)
    readied_queues: set[str] = set()
    if dialects.has_writable_ctes(conn):
        # One round trip: end, attempt rows, results and downstream counters (store/successes.py).
        recorded = _record_at_once(db, conn, items, worker_id=worker_id, hostname=hostname)
        ended, readied, readied_queues = recorded.ended, recorded.readied_runs, recorded.readied_queues
        applied = _applied(conn, items, ended)
        events = _outlet_events(db, conn, applied)
        # The plain counters went in with the statement; the rest travels through `deliver`.
        _, follow_ups, touched = _downstream_effects(db, conn, applied)
    else:
        ended = ti_store.end_running_many(
            conn,
            held=[(t.task_instance_id, t.attempt) for t, _, _, _ in items],
            new_state=TaskState.SUCCESS,
            worker_id=worker_id,
            now=now,
        )
        applied = _applied(conn, items, ended)
        events = _record_successes(db, conn, applied, worker_id=worker_id, hostname=hostname)
        increments, follow_ups, touched = _downstream_effects(db, conn, applied)
        readied = (
            ti_store.count_upstream_successes(conn, increments=increments, now=now, queues=readied_queues)
            if increments
            else set()
        )
    lineage.attempts_ended(db, conn, [(a.task, a.ended_at) for a in applied], LineageEventType.COMPLETE)
    if follow_ups:  # trigger rules, branches, mapped tasks (engine/propagation.py)
        more = deliver(db, conn, follow_ups, now=now)
        readied |= more.runs
        readied_queues |= more.queues
    if readied and not defer_notify:
        dialects.notify_ready(conn)
    # A run where this readied something is active; any other may have just ended (a leaf,
    # or a fan-in whose other branch failed).
    for run_id in sorted(touched - readied - busy_runs):
        close_run_if_done(db, conn, run_id)
    # Last: a dataset's row lock (taken after any task instance lock) is held only to commit.
    record_outlet_events(conn, events)
    outbox.enqueue(db, conn, kind=OutboxKind.DATASET_PUBLISHED, payloads=outbox.dataset_payloads(events))
    return _Completed(
        endings=[Ending(applied=(t.task_instance_id, t.attempt) in ended) for t, _, _, _ in items],
        readied_queues=frozenset(readied_queues),
        # A mapped instance's value is one element of its task's result, not the result.
        values={(a.task.run_id, a.task.task_id): a.value for a in applied if a.task.map_index < 0},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Applied:
    """A success whose compare-and-set moved its row (the worker still held the attempt)."""

    task: ClaimedTask
    value: Any  # Any: the task's JSON result
    outlet_events: Mapping[str, OutletEvent]
    ended_at: datetime
    details: AttemptDetails = _NO_DETAILS


def _applied(
    conn: Connection, items: list[_Item], ended: Mapping[tuple[int, int], datetime]
) -> list[_Applied]:
    """The successes whose fenced end moved their row; the others' reports are discarded."""
    applied = []
    for task, value, outlet_events, details in items:
        ended_at = ended.get((task.task_instance_id, task.attempt))
        if ended_at is None:
            discard_late_report(conn, task, "success")
        else:
            applied.append(
                _Applied(
                    task=task, value=value, outlet_events=outlet_events, ended_at=ended_at, details=details
                )
            )
    return applied


def _record_at_once(
    db: Database, conn: Connection, items: list[_Item], *, worker_id: str, hostname: str
) -> success_store.Recorded:
    """Every success of `items` in one statement: the same rows `end_running_many`,
    `_record_successes` and `count_upstream_successes` write, for the attempts still held."""
    rows: list[success_store.SuccessRow] = []
    edges: list[success_store.Edge] = []
    for task, value, _, details in items:
        rows.append(
            success_store.SuccessRow(
                task_instance_id=task.task_instance_id,
                attempt=task.attempt,
                run_id=task.run_id,
                dag_id=task.dag_id,
                task_id=task.task_id,
                started_at=task.started_at,
                exit_code=details.exit_code,
                code_version=details.code_version,
                outputs=details.outputs,
                # Nothing to store for a first attempt's None: no earlier result to replace.
                store=not (value is None and task.attempt == 1),
                value=value,
            )
        )
        plain, _ = after_success(version_of(db, conn, task.dag_version_id), task, value)
        edges.extend(success_store.Edge(task.task_instance_id, task.attempt, task.run_id, d) for d in plain)
    return success_store.record_successes(conn, rows, edges, worker_id=worker_id, hostname=hostname)


def _outlet_events(db: Database, conn: Connection, applied: list[_Applied]) -> list[dict[str, Any]]:
    """The dataset events of the applied successes' outlets (written last, see `_complete_in`)."""
    events: list[dict[str, Any]] = []
    for a in applied:
        outlets = version_of(db, conn, a.task.dag_version_id).structure.tasks[a.task.task_id].outlets
        if outlets:
            events.extend(outlet_event_rows(db, conn, a.task, outlets, a.outlet_events, at=a.ended_at))
    return events


def _record_successes(
    db: Database, conn: Connection, applied: list[_Applied], *, worker_id: str, hostname: str
) -> list[dict[str, Any]]:
    """Append the attempt rows and results of applied successes; returns their dataset events
    (written last, see `complete_attempts`)."""
    attempts, results = [], []
    for a in applied:
        task = a.task
        attempts.append(
            _attempt_row(
                task,
                outcome=AttemptOutcome.SUCCESS,
                now=a.ended_at,
                worker_id=worker_id,
                hostname=hostname,
                details=a.details,
            )
        )
        if a.value is None and task.attempt == 1:
            continue  # nothing to store: no earlier attempt can have left a result to replace
        results.append(
            {
                "task_instance_id": task.task_instance_id,
                "run_id": task.run_id,
                "task_id": task.task_id,
                "value": a.value,
                "size_bytes": len(json.dumps(a.value)),
                "created_at": a.ended_at,
            }
        )
    attempt_store.insert_attempts(conn, attempts)
    attempt_store.put_results(conn, results)
    return _outlet_events(db, conn, applied)


def _downstream_effects(
    db: Database, conn: Connection, applied: list[_Applied]
) -> tuple[Counter[tuple[str, str]], list[FollowUp], set[str]]:
    """Upstream successes to count per (run, downstream task) on the hot path, what else they
    lead to (engine/propagation.py), and the runs the successes touched."""
    increments: Counter[tuple[str, str]] = Counter()
    follow_ups: list[FollowUp] = []
    for a in applied:
        plain, more = after_success(version_of(db, conn, a.task.dag_version_id), a.task, a.value)
        increments.update((a.task.run_id, d) for d in plain)
        follow_ups.extend(more)
    return increments, follow_ups, {a.task.run_id for a in applied}


def complete_attempt(
    db: Database,
    task: ClaimedTask,
    *,
    worker_id: str,
    hostname: str,
    value: Any,
    outlet_events: Mapping[str, OutletEvent] | None = None,
    details: AttemptDetails | None = None,
) -> Ending:
    """Record success, store the result, record outlet events and ready the downstream, all in
    one transaction. `outlet_events` are the task's annotations (version, metadata) by dataset;
    `details` what the attempt reported besides (exit code, code version, outputs)."""
    return complete_attempts(
        db,
        [(task, value, outlet_events or {}, details or _NO_DETAILS)],
        worker_id=worker_id,
        hostname=hostname,
    )[0]


def fail_attempt(
    db: Database,
    task: ClaimedTask,
    *,
    outcome: AttemptOutcome,
    error: AttemptError,
    worker_id: str | None,
    hostname: str | None,
    lease_expired_before: datetime | None = None,
    timeout_before: datetime | None = None,
    lost_by: str | None = None,
    report_late: bool = True,
    forget_poll_state: bool = False,
    skip_locked: bool = False,
) -> Ending:
    """Record an unsuccessful attempt and apply the retry policy (retry_wait or dead_letter).

    A worker passes its `worker_id` (fence). The reaper passes the evidence instead:
    `lease_expired_before` (outcome lost), `timeout_before` (timed_out while nobody enforced
    it) and `lost_by`, the worker that held the lease, for the record. For `dispatch_timeout`
    the task instance is still queued and `task.attempt` is the attempt it consumes; the
    guard is its dispatch deadline, which must be before `timeout_before`. A dead letter makes
    its downstream upstream_failed and tries to close the run, in the same transaction. A
    worker's report that comes too late is noted on the attempt unless `report_late` is False.
    `forget_poll_state`: the submitted job of a submit-then-poll task ended; a retry submits anew.
    `skip_locked` (the reaper's passes): a row another session holds is left, not waited for,
    and nothing is applied; the next pass reads the evidence again. A worker cut off inside a
    transaction keeps its rows locked until the server ends that transaction, and a pass that
    waited would stall every other row behind it.
    """
    rand = random.random()
    guard = _FailureGuard(
        worker_id=worker_id, lease_expired_before=lease_expired_before, timeout_before=timeout_before
    )

    def work(conn: Connection) -> Ending:
        if skip_locked and not ti_store.lock_unless_held(conn, task.task_instance_id):
            return Ending(applied=False)
        now = db_now(conn)
        version = version_of(db, conn, task.dag_version_id)
        plan = plan_failure(
            version.structure.tasks[task.task_id].retry,
            outcome=outcome,
            attempt_in_budget=task.attempt - task.budget_base,
            orphaned_count=task.orphaned_count,
            retryable=error.retryable,
            rand=rand,
            now=now,
        )
        if not _end_failed(
            conn, task, plan, outcome=outcome, guard=guard, now=now, forget_poll_state=forget_poll_state
        ):
            if worker_id is not None and report_late:
                discard_late_report(conn, task, outcome.value)
            return Ending(applied=False)
        insert_attempt_record(
            conn,
            task,
            outcome=outcome,
            now=now,
            worker_id=worker_id or lost_by or "",
            hostname=hostname or "",
            error=error,
            retry_delay_s=plan.decision.delay_s if plan.decision.retry else None,
            started=outcome is not AttemptOutcome.DISPATCH_TIMEOUT,
        )
        if outcome is not AttemptOutcome.DISPATCH_TIMEOUT:
            lineage.attempts_ended(db, conn, [(task, now)], LineageEventType.FAIL)
        if plan.state is TaskState.DEAD_LETTER:
            alert = outbox.dead_letter_payload(task, error, reason=plan.dead_letter_reason, at=now)
            outbox.enqueue(db, conn, kind=OutboxKind.TASK_DEAD_LETTER, payloads=[alert])
            after_dead_letter(db, conn, task, now=now)  # downstream trigger rules decide
            close_run_if_done(db, conn, task.run_id)
            _record_failed_quality(
                db, conn, task, error, outlets=version.structure.tasks[task.task_id].outlets, at=now
            )
        return Ending(applied=True, decision=plan.decision)

    return db.transact(work)


def _record_failed_quality(
    db: Database,
    conn: Connection,
    task: ClaimedTask,
    error: AttemptError,
    *,
    outlets: Sequence[str],
    at: datetime,
) -> None:
    """A quality gate whose blocker failed still records its outlets' events, marked failed, so
    the failed version is on record; such an event never triggers consumers (store/datasets.py)."""
    quality = (error.outputs or {}).get("quality")
    if not outlets or not isinstance(quality, dict):
        return
    extra = {"quality": "failed", "checks": quality.get("checks", [])}
    annotations = {name: OutletEvent(extra=extra) for name in outlets}
    record_outlet_events(conn, outlet_event_rows(db, conn, task, outlets, annotations, at=at))


@dataclass(frozen=True, slots=True, kw_only=True)
class _FailureGuard:
    """What entitles the caller to end the attempt: the worker's fence, or the reaper's evidence."""

    worker_id: str | None
    lease_expired_before: datetime | None
    timeout_before: datetime | None


def _end_failed(
    conn: Connection,
    task: ClaimedTask,
    plan: FailurePlan,
    *,
    outcome: AttemptOutcome,
    guard: _FailureGuard,
    now: datetime,
    forget_poll_state: bool = False,
) -> bool:
    """The guarded write of a failure plan; False if another party moved the attempt first."""
    if outcome is AttemptOutcome.DISPATCH_TIMEOUT:
        assert guard.timeout_before is not None
        return ti_store.end_queued(
            conn,
            task_instance_id=task.task_instance_id,
            attempt=task.attempt,
            new_state=plan.state,
            now=now,
            deadline_before=guard.timeout_before,
            next_attempt_at=plan.next_attempt_at,
            dead_letter_reason=plan.dead_letter_reason,
        )
    return ti_store.end_running(
        conn,
        task_instance_id=task.task_instance_id,
        attempt=task.attempt,
        new_state=plan.state,
        by=ending_use_case(outcome, reported=guard.worker_id is not None),
        now=now,
        worker_id=guard.worker_id,
        lease_expired_before=guard.lease_expired_before,
        timeout_before=guard.timeout_before,
        next_attempt_at=plan.next_attempt_at,
        dead_letter_reason=plan.dead_letter_reason,
        orphaned=plan.orphaned,
        forget_poll_state=forget_poll_state,
    )


def hand_back_attempts(db: Database, tasks: list[ClaimedTask], *, worker_id: str, hostname: str) -> int:
    """Give unfinished attempts back to the queue without spending a retry (graceful shutdown).

    Each is recorded with outcome `rejected`; returns how many were still ours to hand back.
    """

    def work(conn: Connection) -> int:
        now = db_now(conn)
        handed = 0
        for task in tasks:
            if ti_store.hand_back(
                conn,
                task_instance_id=task.task_instance_id,
                attempt=task.attempt,
                worker_id=worker_id,
                now=now,
            ):
                handed += 1
                insert_attempt_record(
                    conn,
                    task,
                    outcome=AttemptOutcome.REJECTED,
                    now=now,
                    worker_id=worker_id,
                    hostname=hostname,
                    error=AttemptError(
                        error_type="WorkerShutdown",
                        message="the worker stopped before the attempt finished; handed back "
                        "to the queue without spending a retry",
                        frame="treadle.worker",
                    ),
                )
                if task.started_at is not None:
                    lineage.attempts_ended(db, conn, [(task, now)], LineageEventType.ABORT)
        if handed:
            dialects.notify_ready(conn)
        return handed

    return db.transact(work)


def extend_leases(
    db: Database, *, worker_id: str, held: list[tuple[int, int]], lease_s: float, attempts: int = 8
) -> tuple[set[tuple[int, int]], set[int]]:
    """Renew this worker's leases; returns the (task instance id, attempt) pairs it still holds,
    and the task instance ids whose rows another transaction held (left for the next renewal).

    A heartbeat passes few `attempts`: the next heartbeat is the retry.
    """

    def work(conn: Connection) -> tuple[set[tuple[int, int]], set[int]]:
        return ti_store.extend_leases(conn, worker_id=worker_id, held=held, now=db_now(conn), lease_s=lease_s)

    return db.transact(work, attempts=attempts)


def _attempt_row(
    task: ClaimedTask,
    *,
    outcome: AttemptOutcome,
    now: datetime,
    worker_id: str,
    hostname: str,
    details: AttemptDetails = _NO_DETAILS,
) -> dict[str, Any]:
    """Columns of the `task_attempts` row of a successful attempt."""
    return {
        "task_instance_id": task.task_instance_id,
        "run_id": task.run_id,
        "dag_id": task.dag_id,
        "task_id": task.task_id,
        "attempt": task.attempt,
        "outcome": outcome.value,
        "error_type": None,
        "error_message": None,
        "traceback": None,
        "fingerprint": None,
        "worker_id": worker_id or None,
        "hostname": hostname or None,
        "started_at": task.started_at,
        "ended_at": now,
        "duration_s": max((now - task.started_at).total_seconds(), 0.0) if task.started_at else None,
        "retry_delay_s": None,
        "exit_code": details.exit_code,
        "code_version": details.code_version,
        "outputs": details.outputs,
    }


def insert_attempt_record(
    conn: Connection,
    task: ClaimedTask,
    *,
    outcome: AttemptOutcome,
    now: datetime,
    worker_id: str,
    hostname: str,
    error: AttemptError | None = None,
    retry_delay_s: float | None = None,
    started: bool = True,
) -> None:
    """Append the `task_attempts` row of an attempt that ended (`started` False: it never ran)."""
    started = started and task.started_at is not None
    attempt_store.insert_attempt(
        conn,
        task_instance_id=task.task_instance_id,
        run_id=task.run_id,
        dag_id=task.dag_id,
        task_id=task.task_id,
        attempt=task.attempt,
        outcome=outcome.value,
        error_type=error.error_type[:250] if error else None,
        error_message=error.message[:MAX_MESSAGE_CHARS] if error else None,
        traceback=error.traceback[-MAX_TRACEBACK_CHARS:] if error else None,
        fingerprint=fingerprint(error.error_type, error.message, error.frame) if error else None,
        worker_id=worker_id or None,
        hostname=hostname or None,
        started_at=task.started_at if started else None,
        ended_at=now,
        duration_s=max((now - task.started_at).total_seconds(), 0.0)
        if started and task.started_at is not None
        else None,
        retry_delay_s=retry_delay_s,
        exit_code=error.exit_code if error else None,
        code_version=error.code_version if error else None,
        outputs=error.outputs if error else None,
    )


def spec_of(version: DagVersion, task_id: str) -> SensorSpec:
    """The sensor settings of a task (ValueError if it is an ordinary task)."""
    spec = version.structure.tasks[task_id].sensor
    if spec is None:
        raise ValueError(f"task {task_id!r} is not a sensor or a submit-then-poll task")
    return spec


def _reschedule_all(
    db: Database, conn: Connection, pokes: list[Reschedule], *, worker_id: str, hostname: str
) -> list[Ending]:
    """Record a pass's reschedules: in one statement where the dialect allows (the same rows
    `reschedule_in` writes for each), else one by one."""
    if not pokes:
        return []
    now = db_now(conn)
    if not dialects.has_writable_ctes(conn):
        return [reschedule_in(db, conn, p, worker_id=worker_id, hostname=hostname, now=now) for p in pokes]
    rows = []
    for poke in pokes:
        task = poke.task
        spec = spec_of(version_of(db, conn, task.dag_version_id), task.task_id)
        first = poke.first_poke_at or task.started_at or now
        rows.append(
            poke_store.RescheduleRow(
                task_instance_id=task.task_instance_id,
                attempt=task.attempt,
                first_poke_at=first,
                next_attempt_at=next_poke_at(spec, first_poke_at=first, now=now),
                poll_handle=poke.state,
                run_id=task.run_id,
                dag_id=task.dag_id,
                task_id=task.task_id,
                started_at=task.started_at,
                code_version=poke.code_version,
                evidence=poke.evidence or None,
            )
        )
    moved = poke_store.reschedule_many(conn, rows, worker_id=worker_id, hostname=hostname, now=now)
    endings = []
    for poke in pokes:
        applied = (poke.task.task_instance_id, poke.task.attempt) in moved
        if not applied:
            discard_late_report(conn, poke.task, "reschedule")
        endings.append(Ending(applied=applied))
    return endings


def reschedule_in(
    db: Database,
    conn: Connection,
    poke: Reschedule,
    *,
    worker_id: str,
    hostname: str,
    now: datetime | None = None,
) -> Ending:
    """Record a poke's reschedule in the caller's transaction (see `Reschedule`).

    Fenced like a failure: applied only while this worker holds the attempt. The attempt is
    recorded `rescheduled` with the poke's evidence in its outputs; the state is stored in the
    same statement as the reschedule. `now`: the database time (read here when None).
    """
    task = poke.task
    now = now or db_now(conn)
    spec = spec_of(version_of(db, conn, task.dag_version_id), task.task_id)
    first = poke.first_poke_at or task.started_at or now
    moved = poke_store.reschedule(
        conn,
        task_instance_id=task.task_instance_id,
        attempt=task.attempt,
        worker_id=worker_id,
        now=now,
        first_poke_at=first,
        next_attempt_at=next_poke_at(spec, first_poke_at=first, now=now),
        poll_handle=poke.state,
    )
    if not moved:
        discard_late_report(conn, task, "reschedule")
        return Ending(applied=False)
    attempt_store.insert_attempt(
        conn,
        task_instance_id=task.task_instance_id,
        run_id=task.run_id,
        dag_id=task.dag_id,
        task_id=task.task_id,
        attempt=task.attempt,
        outcome=AttemptOutcome.RESCHEDULED.value,
        worker_id=worker_id or None,
        hostname=hostname or None,
        started_at=task.started_at,
        ended_at=now,
        duration_s=max((now - task.started_at).total_seconds(), 0.0) if task.started_at else None,
        code_version=poke.code_version,
        outputs=poke.evidence or None,
    )
    return Ending(applied=True)


def discard_late_report(conn: Connection, task: ClaimedTask, what: str) -> None:
    """A report for an attempt this worker no longer holds: record it, apply nothing (fencing)."""
    attempt_store.mark_late_result(
        conn,
        task_instance_id=task.task_instance_id,
        attempt=task.attempt,
        note=f"late {what} discarded",
    )
    log.warning(
        "late report discarded",
        extra={
            "event": "task_instance.late_report_discarded",
            "task_instance_id": task.task_instance_id,
            "attempt": task.attempt,
            "report": what,
        },
    )
