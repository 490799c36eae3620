"""Recording a batch of successes in one statement, where the dialect has writable CTEs.

A dispatch pass records its slots' successes before it claims (engine/execution.py). On
PostgreSQL that is one round trip instead of four: the fenced end of every attempt, its
`task_attempts` row, its result and the downstream counters are data-modifying CTEs of one
statement, each joined to the rows the fenced UPDATE actually moved, so an attempt the worker
lost records nothing, exactly as when the statements ran one after another. Elsewhere the
engine runs those statements one by one (`end_running_many`, `insert_attempts`, `put_results`,
`count_upstream_successes`), which this must stay equal to.

The CTEs never update the same row twice: `ended` moves the attempts' own rows and `readied`
their downstream rows, and no task is downstream of itself. SET expressions read the row's old
values, as in `count_upstream_successes`, so a fan-in row is queued by exactly the completion
that fills its counter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import AttemptOutcome, TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.store import dialects
from treadle.store.tables import UTCDateTime


@dataclass(frozen=True, slots=True)
class SuccessRow:
    """One success to record: the attempt, what its `task_attempts` row says, and its result."""

    task_instance_id: int
    attempt: int
    run_id: str
    dag_id: str
    task_id: str
    started_at: datetime | None
    exit_code: int | None
    code_version: str | None
    outputs: Any
    #: Whether to store `value` (a first attempt that returned None stores nothing).
    store: bool
    value: Any


@dataclass(frozen=True, slots=True)
class Edge:
    """A success of (task instance, attempt) counts once toward a downstream task of its run."""

    task_instance_id: int
    attempt: int
    run_id: str
    task_id: str


@dataclass(frozen=True, slots=True)
class Recorded:
    #: (task instance id, attempt) of each success that moved its row, with the `ended_at` written.
    ended: dict[tuple[int, int], datetime]
    #: Runs and queues of the downstream rows that became queued.
    readied_runs: set[str]
    readied_queues: set[str]


def _in(states: Sequence[str]) -> str:
    """A SQL list of state names (constants of the transition table, never user input)."""
    return ", ".join(f"'{s}'" for s in states)


def _statement() -> sa.TextualSelect:
    ending = _in(task_sources(UseCase.COMPLETE, TaskState.SUCCESS))
    waiting = _in(task_sources(UseCase.READY, TaskState.QUEUED))
    ready = f"t.state IN ({waiting}) AND t.upstream_done + edges.n >= t.upstream_total"
    sql = f"""
WITH v AS (
    SELECT * FROM unnest(
        CAST(:ids AS BIGINT[]), CAST(:attempts AS INTEGER[]), CAST(:run_ids AS TEXT[]),
        CAST(:dag_ids AS TEXT[]), CAST(:task_ids AS TEXT[]), CAST(:started AS TIMESTAMPTZ[]),
        CAST(:exit_codes AS INTEGER[]), CAST(:code_versions AS TEXT[]), CAST(:outputs AS TEXT[]),
        CAST(:stores AS BOOLEAN[]), CAST(:vals AS TEXT[]), CAST(:sizes AS INTEGER[])
    ) AS v(id, attempt, run_id, dag_id, task_id, started_at, exit_code, code_version, outputs,
           store, val, size_bytes)
),
ended AS (
    UPDATE task_instances AS t
    SET state = '{TaskState.SUCCESS.value}', ended_at = statement_timestamp(),
        lease_expires_at = NULL, next_attempt_at = NULL, dead_letter_reason = NULL
    FROM v
    WHERE t.id = v.id AND t.attempt = v.attempt AND {dialects.UNINDEXED_STATE} IN ({ending})
      AND t.worker_id = :worker
    RETURNING t.id, t.attempt, t.ended_at
),
recorded AS (
    INSERT INTO task_attempts (task_instance_id, run_id, dag_id, task_id, attempt, outcome,
        worker_id, hostname, started_at, ended_at, duration_s, exit_code, code_version, outputs)
    SELECT v.id, v.run_id, v.dag_id, v.task_id, v.attempt, '{AttemptOutcome.SUCCESS.value}',
        :attempt_worker, :attempt_host, v.started_at, e.ended_at,
        CASE WHEN v.started_at IS NOT NULL THEN
            CAST(GREATEST(EXTRACT(EPOCH FROM (e.ended_at - v.started_at)), 0) AS DOUBLE PRECISION) END,
        v.exit_code, v.code_version, CAST(v.outputs AS JSONB)
    FROM v JOIN ended AS e ON e.id = v.id AND e.attempt = v.attempt
),
stored AS (
    INSERT INTO task_results (task_instance_id, run_id, task_id, value, size_bytes, created_at)
    SELECT v.id, v.run_id, v.task_id, CAST(v.val AS JSONB), v.size_bytes, e.ended_at
    FROM v JOIN ended AS e ON e.id = v.id AND e.attempt = v.attempt
    WHERE v.store
    ON CONFLICT (task_instance_id) DO UPDATE SET run_id = excluded.run_id,
        task_id = excluded.task_id, value = excluded.value, size_bytes = excluded.size_bytes,
        created_at = excluded.created_at
),
edges AS (
    SELECT g.run_id, g.task_id, count(*) AS n
    FROM unnest(CAST(:edge_ids AS BIGINT[]), CAST(:edge_attempts AS INTEGER[]),
                CAST(:edge_runs AS TEXT[]), CAST(:edge_tasks AS TEXT[])) AS g(id, attempt, run_id, task_id)
    JOIN ended AS e ON e.id = g.id AND e.attempt = g.attempt
    GROUP BY g.run_id, g.task_id
),
readied AS (
    UPDATE task_instances AS t
    SET queued_at = CASE WHEN {ready} THEN statement_timestamp() ELSE t.queued_at END,
        dispatch_deadline = CASE WHEN {ready}
            THEN statement_timestamp() + interval '1 second' * t.queue_timeout_s
            ELSE t.dispatch_deadline END,
        state = CASE WHEN {ready} THEN '{TaskState.QUEUED.value}' ELSE t.state END,
        upstream_done = t.upstream_done + edges.n
    FROM edges
    WHERE t.run_id = edges.run_id AND t.task_id = edges.task_id
    RETURNING t.run_id, t.state, t.queue
)
SELECT 'ended' AS kind, id, attempt, ended_at, NULL AS run_id, NULL AS state, NULL AS queue FROM ended
UNION ALL
SELECT 'readied', NULL, NULL, NULL, run_id, state, queue FROM readied
"""
    return sa.text(sql).columns(
        sa.column("kind", sa.String()),
        sa.column("id", sa.BigInteger()),
        sa.column("attempt", sa.Integer()),
        sa.column("ended_at", UTCDateTime()),
        sa.column("run_id", sa.String()),
        sa.column("state", sa.String()),
        sa.column("queue", sa.String()),
    )


def record_successes(
    conn: Connection,
    rows: Sequence[SuccessRow],
    edges: Sequence[Edge],
    *,
    worker_id: str,
    hostname: str,
) -> Recorded:
    """End, record and count downstream every success in `rows` that `worker_id` still holds,
    in one statement (only where `dialects.has_writable_ctes`). `edges`: the downstream counters
    each success adds to if it is applied."""
    stmt = dialects.built_once(conn, "record successes", _statement)
    dumped = [json.dumps(r.value) if r.store else None for r in rows]
    params = {
        "ids": [r.task_instance_id for r in rows],
        "attempts": [r.attempt for r in rows],
        "run_ids": [r.run_id for r in rows],
        "dag_ids": [r.dag_id for r in rows],
        "task_ids": [r.task_id for r in rows],
        "started": [r.started_at for r in rows],
        "exit_codes": [r.exit_code for r in rows],
        "code_versions": [r.code_version for r in rows],
        # As the JSON column type stores them: None is JSON null, not SQL NULL.
        "outputs": [json.dumps(r.outputs) for r in rows],
        "stores": [r.store for r in rows],
        "vals": dumped,
        "sizes": [len(d) if d is not None else 0 for d in dumped],
        "worker": worker_id,
        "attempt_worker": worker_id or None,
        "attempt_host": hostname or None,
        "edge_ids": [e.task_instance_id for e in edges],
        "edge_attempts": [e.attempt for e in edges],
        "edge_runs": [e.run_id for e in edges],
        "edge_tasks": [e.task_id for e in edges],
    }
    ended: dict[tuple[int, int], datetime] = {}
    runs: set[str] = set()
    queues: set[str] = set()
    for r in conn.execute(stmt, params):
        if r.kind == "ended":
            ended[(r.id, r.attempt)] = r.ended_at
        elif r.state == TaskState.QUEUED.value:
            runs.add(r.run_id)
            queues.add(r.queue)
    return Recorded(ended=ended, readied_runs=runs, readied_queues=queues)
