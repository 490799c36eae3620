"""Interleavings of the engine's use cases, driven by Hypothesis against a real database (R11).

A `RuleBasedStateMachine` plays two workers on two connection pools (two `Database` objects,
standing for two processes) and an operator against small runs of one DAG: a diamond
top -> {slow, side} -> bottom plus an independent leaf `lone`. It triggers runs, claims (some
attempts buffered, some with a lease that is already over), starts, completes and fails
attempts, reports as a worker that lost its attempt, heartbeats, reaps, enforces deadlines,
promotes retries, cancels, requeues dead letters, clears and sweeps, each step a real call on one
of the two pools. Steps run one at a time and every outcome is deterministic (deadlines are
waited out, never raced), so Hypothesis can replay and shrink a failure. After every step it
checks the invariants against the database:

* no run in a terminal state has an active task instance (run open/close protocol);
* after a sweep, no run is left running with every instance terminal;
* at most one `success` attempt per task instance and clear (each clear is a fresh budget);
* every (task instance, attempt) has at most one `task_attempts` row, and none is beyond the
  instance's own attempt number;
* failures that spend the budget never exceed it (I4);
* a report of an attempt the worker no longer holds is discarded and changes nothing;
* every state change between two steps follows the state machine's allowed edges (at most two
  edges per step: one call may, for example, reopen a run and clear a task);
* refusals (clear of an active instance, requeue into a cancelled run) change nothing.

One database per test; each example triggers its own runs and checks only those (its teardown
ends whatever it left active, so the next example's claims see only its own runs). Deadlines are
waited for by polling, never by fixed sleeps. Set TREADLE_INTERLEAVING_EXAMPLES (default 50) and
TREADLE_INTERLEAVING_STEPS (default 30) for a longer run.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.domain.states import (
    ACTIVE_TASK_STATES,
    TERMINAL_RUN_STATES,
    AttemptOutcome,
    RunState,
    TaskState,
)
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.domain.transitions import run_edges, task_edges
from treadle.engine.cancellation import cancel_run, cancel_task
from treadle.engine.clearing import clear_tasks
from treadle.engine.dead_letters import requeue_dead_letter
from treadle.engine.execution import (
    Ending,
    claim_task_instances,
    complete_attempt,
    extend_leases,
    fail_attempt,
    start_claimed,
)
from treadle.engine.reaper import (
    enforce_execution_deadlines,
    expire_dispatch_deadlines,
    promote_due_retries,
    reap_expired_leases,
)
from treadle.engine.runs import finish_idle_runs, trigger_run
from treadle.errors import InvalidRequest, RunCancelledError
from treadle.store.database import Database, db_now
from treadle.store.tables import dag_runs, task_attempts, task_instances, task_results
from treadle.testing import DagRunner

EXAMPLES = int(os.environ.get("TREADLE_INTERLEAVING_EXAMPLES", "50"))
STEPS = int(os.environ.get("TREADLE_INTERLEAVING_STEPS", "30"))

RETRIES = 1
#: `slow`'s execution deadline and `lone`'s dispatch deadline: short enough to pass within a step.
SHORT_S = 0.05
#: A lease that is over by the time anyone looks at it (the worker "died" right after claiming).
DEAD_LEASE_S = 0.001
LONG_LEASE_S = 600.0
WORKERS = ("worker-1", "worker-2")
TASKS = ("top", "slow", "side", "bottom", "lone")
MAX_RUNS = 3


@task(retries=RETRIES, retry_delay=0)
def top() -> int:
    return 1


@task(retries=RETRIES, retry_delay=0, timeout=SHORT_S)
def slow(x: int) -> int:
    return x


@task(retries=RETRIES, retry_delay=0)
def side(x: int) -> int:
    return x


@task(retries=RETRIES, retry_delay=0)
def bottom(a: int, b: int) -> int:
    return a + b


@task(retries=RETRIES, retry_delay=0, queue_timeout=SHORT_S)
def lone() -> int:
    return 0


@dag(dag_id="interleave_diamond")
def diamond() -> None:
    first = top()
    bottom(slow(first), side(first))
    lone()


TASK_EDGES = task_edges()
RUN_EDGES = run_edges()
ACTIVE = frozenset(s.value for s in ACTIVE_TASK_STATES)
TERMINAL_RUNS = frozenset(s.value for s in TERMINAL_RUN_STATES)
#: Attempt outcomes that spend the retry budget (lost, cancelled and rejected do not).
SPENDING = (
    AttemptOutcome.FAILED.value,
    AttemptOutcome.TIMED_OUT.value,
    AttemptOutcome.DISPATCH_TIMEOUT.value,
)
#: Task-instance columns a discarded report or a refused request must leave as they were.
WATCHED = (
    "state",
    "attempt",
    "budget_base",
    "orphaned_count",
    "worker_id",
    "started_at",
    "ended_at",
    "lease_expires_at",
    "next_attempt_at",
    "dead_letter_reason",
    "upstream_done",
)


def _reachable(edges: frozenset[tuple[str, str]], old: str, new: str) -> bool:
    """`new` follows `old` by one allowed edge or by two."""
    if (old, new) in edges:
        return True
    return any((old, mid) in edges and (mid, new) in edges for _, mid in edges)


@dataclass(frozen=True, slots=True)
class Held:
    """An attempt a worker holds (as far as the worker knows)."""

    worker: str
    task: ClaimedTask
    dead_lease: bool

    @property
    def key(self) -> tuple[int, int]:
        return (self.task.task_instance_id, self.task.attempt)

    @property
    def started(self) -> bool:
        return self.task.started_at is not None


def _other(worker: str) -> str:
    return WORKERS[1 - WORKERS.index(worker)]


def _error(retryable: bool) -> AttemptError:
    return AttemptError(error_type="Boom", message="the task raised", retryable=retryable)


class Interleavings(RuleBasedStateMachine):
    """The workers, the operator and the scheduler's duties on `pools` (set by a subclass)."""

    pools: tuple[Database, Database]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[str] = []
        self.held: list[Held] = []
        #: Reports the workers could still send for attempts they lost: (worker, attempt).
        self.stale: list[tuple[str, ClaimedTask]] = []
        self.clears: Counter[tuple[str, str]] = Counter()
        self.seen_tasks: dict[int, str] = {}
        self.seen_runs: dict[str, str] = {}
        self.rows: list[Any] = []
        self.steps = 0
        self.swept_at = -1
        self.run_state: dict[str, str] = {}

    # ---- reading the database -------------------------------------------------------

    def _read(self, fn: Callable[[sa.Connection], Any]) -> Any:
        with self.pools[0].read() as conn:
            return fn(conn)

    def _instances(self) -> list[Any]:
        if not self.runs:
            return []
        return self._read(
            lambda c: list(
                c.execute(
                    sa.select(task_instances)
                    .where(task_instances.c.run_id.in_(self.runs))
                    .order_by(task_instances.c.id)
                )
            )
        )

    def _run_states(self) -> dict[str, str]:
        if not self.runs:
            return {}
        rows = self._read(
            lambda c: list(
                c.execute(
                    sa.select(dag_runs.c.run_id, dag_runs.c.state).where(dag_runs.c.run_id.in_(self.runs))
                )
            )
        )
        return {r.run_id: r.state for r in rows}

    def _attempt_rows(self) -> list[Any]:
        if not self.runs:
            return []
        return self._read(
            lambda c: list(
                c.execute(
                    sa.select(
                        task_attempts.c.task_instance_id,
                        task_attempts.c.attempt,
                        task_attempts.c.outcome,
                        task_attempts.c.run_id,
                        task_attempts.c.task_id,
                    ).where(task_attempts.c.run_id.in_(self.runs))
                )
            )
        )

    def _picture(self) -> tuple[Any, ...]:
        """Everything a discarded report or a refused request must not change."""
        tis = tuple(tuple(getattr(r, c) for c in ("id", *WATCHED)) for r in self._instances())
        runs = tuple(sorted(self._run_states().items()))
        results = self._read(
            lambda c: c.execute(
                sa.select(sa.func.count()).where(task_results.c.run_id.in_(self.runs))
            ).scalar_one()
        )
        outcomes = tuple(sorted((r.task_instance_id, r.attempt, r.outcome) for r in self._attempt_rows()))
        return tis, runs, results, outcomes

    def _still_held(self, h: Held, rows: dict[int, Any]) -> bool:
        row = rows.get(h.task.task_instance_id)
        return (
            row is not None
            and row.state == TaskState.RUNNING.value
            and row.attempt == h.task.attempt
            and row.worker_id == h.worker
        )

    def _reconcile(self) -> None:
        """Attempts that were reaped, cancelled or timed out are no longer held: their
        worker does not know yet and may still report them (stale reports)."""
        rows = {r.id: r for r in self.rows}
        keep = []
        for h in self.held:
            if self._still_held(h, rows):
                keep.append(h)
            else:
                self.stale.append((h.worker, h.task))
        self.held = keep

    # What the last check saw (rules pick their targets from it; preconditions read it).

    def _in_state(self, *states: str, task_id: str | None = None) -> list[Any]:
        return [r for r in self.rows if r.state in states and task_id in (None, r.task_id)]

    def _open_runs(self) -> list[str]:
        return [r for r in self.runs if self.run_state.get(r) not in TERMINAL_RUNS]

    # ---- setting up an example ------------------------------------------------------

    @initialize(pool=st.integers(0, 1))
    def first_run(self, pool: int) -> None:
        self._trigger(pool)

    def teardown(self) -> None:
        """Leave nothing active for the next example (its claims must only see its runs)."""
        if not self.runs:
            return
        with self.pools[0].begin() as conn:
            conn.execute(
                sa.update(task_instances)
                .where(task_instances.c.run_id.in_(self.runs), task_instances.c.state.in_(ACTIVE))
                .values(state=TaskState.CANCELLED.value, lease_expires_at=None)
            )
            conn.execute(
                sa.update(dag_runs)
                .where(dag_runs.c.run_id.in_(self.runs), dag_runs.c.state.not_in(TERMINAL_RUNS))
                .values(state=RunState.CANCELLED.value)
            )

    def _trigger(self, pool: int) -> None:
        run = trigger_run(self.pools[pool], diamond.dag_id, triggered_by="interleave")
        self.runs.append(run.run_id)

    # ---- workers --------------------------------------------------------------------

    @precondition(lambda self: bool(self._in_state(TaskState.QUEUED.value)))
    @rule(
        pool=st.integers(0, 1),
        worker=st.sampled_from(WORKERS),
        limit=st.integers(1, 2),
        buffered=st.booleans(),
        dead_lease=st.booleans(),
    )
    def claim(self, pool: int, worker: str, limit: int, buffered: bool, dead_lease: bool) -> None:
        """Claim attempts (buffered: unstarted; dead_lease: the worker dies at once)."""
        claimed = claim_task_instances(
            self.pools[pool],
            worker_id=worker,
            hostname=f"host-{worker}",
            queues=["default"],
            limit=limit,
            lease_s=DEAD_LEASE_S if dead_lease else LONG_LEASE_S,
            start=0 if buffered else None,
        )
        assert 1 <= len(claimed) <= limit, f"claimed {len(claimed)} of queued work with limit {limit}"
        for t in claimed:
            assert t.run_id in self.runs, f"claimed {t.task_id} of a run outside this example"
            assert (t.started_at is None) == buffered
            self.held.append(Held(worker=worker, task=t, dead_lease=dead_lease))

    @precondition(lambda self: bool(self._in_state(TaskState.QUEUED.value)))
    @rule(pool=st.integers(0, 1), worker=st.sampled_from(WORKERS))
    def claim_and_succeed(self, pool: int, worker: str) -> None:
        """A prompt worker: claims what is queued (up to 3) and reports every success at once."""
        claimed = claim_task_instances(
            self.pools[pool],
            worker_id=worker,
            hostname=f"host-{worker}",
            queues=["default"],
            limit=3,
            lease_s=LONG_LEASE_S,
        )
        assert claimed, "nothing claimed while work was queued"
        for t in claimed:
            assert t.run_id in self.runs, f"claimed {t.task_id} of a run outside this example"
            ending = complete_attempt(
                self.pools[1 - pool], t, worker_id=worker, hostname=f"host-{worker}", value=t.attempt
            )
            assert ending.applied, f"the success of {t.task_id} #{t.attempt} by its holder was discarded"

    def _pick(self, which: Callable[[Held], bool], index: int) -> Held:
        candidates = [h for h in self.held if which(h)]
        return candidates[index % len(candidates)]

    @precondition(lambda self: any(not h.started for h in self.held))
    @rule(index=st.integers(0, 7), pool=st.integers(0, 1))
    def start(self, index: int, pool: int) -> None:
        h = self._pick(lambda h: not h.started, index)
        started = start_claimed(self.pools[pool], h.task, worker_id=h.worker)
        assert started is not None, f"{h.worker} could not start {h.key} that it still holds"
        self.held[self.held.index(h)] = replace(h, task=started)

    @precondition(lambda self: any(h.started for h in self.held))
    @rule(index=st.integers(0, 7), pool=st.integers(0, 1))
    def complete(self, index: int, pool: int) -> None:
        h = self._pick(lambda h: h.started, index)
        ending = complete_attempt(
            self.pools[pool], h.task, worker_id=h.worker, hostname=f"host-{h.worker}", value=h.task.attempt
        )
        assert ending.applied, f"the success of {h.key} reported by its holder {h.worker} was discarded"
        self.held.remove(h)

    @precondition(lambda self: any(h.started for h in self.held))
    @rule(index=st.integers(0, 7), pool=st.integers(0, 1), retryable=st.booleans())
    def fail(self, index: int, pool: int, retryable: bool) -> None:
        h = self._pick(lambda h: h.started, index)
        ending = fail_attempt(
            self.pools[pool],
            h.task,
            outcome=AttemptOutcome.FAILED,
            error=_error(retryable),
            worker_id=h.worker,
            hostname=f"host-{h.worker}",
        )
        assert ending.applied, f"the failure of {h.key} reported by its holder {h.worker} was discarded"
        assert ending.decision is not None
        if not retryable:
            assert not ending.decision.retry
        self.held.remove(h)

    @precondition(lambda self: bool(self.held or self.stale))
    @rule(
        index=st.integers(0, 7),
        pool=st.integers(0, 1),
        kind=st.sampled_from(["lost", "wrong_worker", "older_attempt", "newer_attempt"]),
        success=st.booleans(),
    )
    def stale_report(self, index: int, pool: int, kind: str, success: bool) -> None:
        """A report that must be discarded: of an attempt the worker lost, by the other
        worker, or naming the wrong attempt of a held instance."""
        if (kind == "lost" and self.stale) or not self.held:
            worker, t = self.stale[index % len(self.stale)]
        else:
            h = self.held[index % len(self.held)]
            if kind == "wrong_worker":
                worker, t = _other(h.worker), h.task
            else:
                step = -1 if kind == "older_attempt" else 1
                worker, t = h.worker, replace(h.task, attempt=h.task.attempt + step)
        before = self._picture()
        ending: Ending
        if success:
            ending = complete_attempt(self.pools[pool], t, worker_id=worker, hostname="late", value="stale")
        else:
            ending = fail_attempt(
                self.pools[pool],
                t,
                outcome=AttemptOutcome.FAILED,
                error=_error(True),
                worker_id=worker,
                hostname="late",
            )
        event(f"stale report: {kind}")
        attempt = (t.task_instance_id, t.attempt)
        assert not ending.applied, f"a stale report ({kind}) of {attempt} by {worker} was applied"
        assert self._picture() == before, f"a discarded report ({kind}) of {attempt} changed state"

    @precondition(lambda self: bool(self.held))
    @rule(worker=st.sampled_from(WORKERS), pool=st.integers(0, 1), last=st.booleans())
    def heartbeat(self, worker: str, pool: int, last: bool) -> None:
        """Renew the worker's leases; `last`: its final heartbeat before it dies (the lease
        it leaves is already over)."""
        mine = [h for h in self.held if h.worker == worker]
        if last:
            # The reaper will judge the attempt from this heartbeat: make `slow`'s overrun
            # certain (timed_out), not a matter of how fast this step ran.
            self._wait_overdue([h for h in mine if h.started and h.task.task_id == "slow"])
        renewed, skipped = extend_leases(
            self.pools[pool],
            worker_id=worker,
            held=[h.key for h in mine],
            lease_s=DEAD_LEASE_S if last else LONG_LEASE_S,
        )
        assert not skipped, "a heartbeat skipped a row no other transaction held"
        assert renewed == {h.key for h in mine}, "a heartbeat lost an attempt its worker still held"
        self.held = [replace(h, dead_lease=last) if h.worker == worker else h for h in self.held]

    def _wait_overdue(self, attempts: list[Held]) -> None:
        """Wait until the execution deadline of `attempts` is past in database time."""
        ids = [h.task.task_instance_id for h in attempts]
        if not ids:
            return

        def overdue(c: sa.Connection) -> bool:
            now = db_now(c)
            deadlines = c.execute(sa.select(task_instances.c.timeout_at).where(task_instances.c.id.in_(ids)))
            return all(t is not None and t < now for t in deadlines.scalars())

        wait_for(lambda: self._read(overdue), timeout=20, interval=0.01, message="slow's deadline to pass")

    # ---- the scheduler's duties -----------------------------------------------------

    def _wait_until_gone(self, doomed: list[Held], act: Callable[[], int], what: str) -> None:
        """Call `act` until none of `doomed` is held any more (its deadline has to pass in
        database time first); a polled wait, never a fixed sleep."""

        def done() -> bool:
            act()
            rows = {r.id: r for r in self._instances()}
            return not any(self._still_held(h, rows) for h in doomed)

        wait_for(done, timeout=20, interval=0.01, message=what)

    @precondition(lambda self: any(h.dead_lease for h in self.held))
    @rule(pool=st.integers(0, 1))
    def reap(self, pool: int) -> None:
        doomed = [h for h in self.held if h.dead_lease]
        alive = [h.key for h in self.held if not h.dead_lease]
        self._wait_until_gone(doomed, lambda: reap_expired_leases(self.pools[pool]), "dead leases reaped")
        rows = {r.id: r for r in self._instances()}
        assert all(self._still_held(h, rows) for h in self.held if h.key in alive), (
            "the reaper took an attempt whose lease was alive"
        )

    @precondition(lambda self: any(h.started and h.task.task_id == "slow" for h in self.held))
    @rule(pool=st.integers(0, 1))
    def enforce_deadlines(self, pool: int) -> None:
        doomed = [h for h in self.held if h.started and h.task.task_id == "slow"]
        self._wait_until_gone(
            doomed,
            lambda: enforce_execution_deadlines(self.pools[pool], grace_s=0),
            "overdue attempts of slow timed out",
        )

    @precondition(lambda self: bool(self._in_state(TaskState.QUEUED.value, task_id="lone")))
    @rule(pool=st.integers(0, 1))
    def expire_dispatch(self, pool: int) -> None:
        """lone's dispatch deadline passes while it waits in the queue."""

        def gone() -> bool:
            expire_dispatch_deadlines(self.pools[pool], worker_stale_s=30)
            return not [r for r in self._instances() if r.task_id == "lone" and r.state == "queued"]

        wait_for(gone, timeout=20, interval=0.01, message="lone's dispatch deadline to pass")

    @precondition(lambda self: bool(self._in_state(TaskState.RETRY_WAIT.value)))
    @rule(pool=st.integers(0, 1))
    def promote(self, pool: int) -> None:
        assert promote_due_retries(self.pools[pool]) >= 1, "a retry with no delay was not due"

    @precondition(lambda self: bool(self._open_runs()) and self.swept_at != self.steps)
    @rule(pool=st.integers(0, 1))
    def sweep(self, pool: int) -> None:
        """The sweep (never twice in a row: it is always possible and would crowd out the rest)."""
        self.swept_at = self.steps + 1
        event(f"sweep: closed {finish_idle_runs(self.pools[pool])}")
        by_run: dict[str, list[str]] = {r: [] for r in self.runs}
        for r in self._instances():
            by_run[r.run_id].append(r.state)
        for run_id, state in self._run_states().items():
            if state == RunState.RUNNING.value:
                assert any(s in ACTIVE for s in by_run[run_id]), (
                    f"run {run_id} still running after a sweep with every instance terminal: {by_run[run_id]}"
                )

    # ---- the operator ---------------------------------------------------------------

    @precondition(lambda self: len(self.runs) < MAX_RUNS)
    @rule(pool=st.integers(0, 1))
    def trigger(self, pool: int) -> None:
        self._trigger(pool)

    @precondition(lambda self: bool(self._in_state(*ACTIVE)))
    @rule(index=st.integers(0, 15), pool=st.integers(0, 1))
    def cancel_one_task(self, index: int, pool: int) -> None:
        active = self._in_state(*ACTIVE)
        target = active[index % len(active)]
        result = cancel_task(self.pools[pool], target.run_id, target.task_id, actor="interleave")
        assert target.task_id in result.cancelled

    @precondition(lambda self: bool(self._open_runs()))
    @rule(index=st.integers(0, MAX_RUNS - 1), pool=st.integers(0, 1))
    def cancel_whole_run(self, index: int, pool: int) -> None:
        runs = self._open_runs()
        result = cancel_run(self.pools[pool], runs[index % len(runs)], actor="interleave")
        event(f"cancel run: {len(result.running_killed)} running killed")
        assert result.run_state == RunState.CANCELLED.value

    @precondition(lambda self: bool(self._in_state(TaskState.DEAD_LETTER.value)))
    @rule(index=st.integers(0, 15), pool=st.integers(0, 1))
    def requeue(self, index: int, pool: int) -> None:
        """Requeue a dead letter; refused (changing nothing) inside a cancelled run."""
        letters = self._in_state(TaskState.DEAD_LETTER.value)
        target = letters[index % len(letters)]
        before = self._picture()
        run_before = self.run_state[target.run_id]
        try:
            requeue_dead_letter(self.pools[pool], target.id)
        except RunCancelledError:
            event("requeue: refused in a cancelled run")
            assert run_before == RunState.CANCELLED.value, f"requeue refused in a {run_before} run"
            assert self._picture() == before, "a refused requeue changed state"
        else:
            event(f"requeue: applied in a {run_before} run")
            assert run_before != RunState.CANCELLED.value, "a requeue reopened a cancelled run"
            assert self._run_states()[target.run_id] == RunState.RUNNING.value

    @precondition(lambda self: any(r.state not in ACTIVE for r in self.rows))
    @rule(
        run=st.integers(0, MAX_RUNS - 1),
        task_id=st.one_of(st.none(), st.sampled_from(TASKS)),
        downstream=st.booleans(),
        only_failed=st.booleans(),
        pool=st.integers(0, 1),
    )
    def clear(self, run: int, task_id: str | None, downstream: bool, only_failed: bool, pool: int) -> None:
        """Clear a task (None: every task) of a run; refused, changing nothing, while one is active."""
        run_id = self.runs[run % len(self.runs)]
        before = self._picture()
        run_before = self.run_state[run_id]
        try:
            report = clear_tasks(
                self.pools[pool],
                run_id,
                None if task_id is None else [task_id],
                downstream=downstream,
                actor="interleave",
                reason="",
                only_failed=only_failed,
            )
        except InvalidRequest:
            event("clear: refused")
            assert self._picture() == before, "a refused clear changed state"
            return
        event(f"clear: {'applied' if report.cleared else 'nothing to clear'} in a {run_before} run")
        self.clears.update((run_id, t) for t in report.cleared)
        if report.cleared:
            assert self._run_states()[run_id] == RunState.RUNNING.value

    # ---- invariants (after every step) ----------------------------------------------

    @invariant()
    def database_is_consistent(self) -> None:
        self.steps += 1
        self.rows = self._instances()
        self.run_state = self._run_states()
        self._check_transitions()
        self._check_rows()
        self._reconcile()

    def _check_transitions(self) -> None:
        """Every state change since the last step follows allowed edges (at most two)."""
        for r in self.rows:
            old = self.seen_tasks.get(r.id)
            if old is not None and old != r.state:
                assert _reachable(TASK_EDGES, old, r.state), (
                    f"task instance {r.run_id}/{r.task_id} moved {old} -> {r.state}"
                )
                event(f"task {old} -> {r.state}")
        for run_id, new in self.run_state.items():
            old = self.seen_runs.get(run_id)
            if old is not None and old != new:
                assert _reachable(RUN_EDGES, old, new), f"run {run_id} moved {old} -> {new}"
                event(f"run {old} -> {new}")
        self.seen_tasks = {r.id: r.state for r in self.rows}
        self.seen_runs = dict(self.run_state)

    def _check_rows(self) -> None:
        # (1) a terminal run has no active task instance.
        for r in self.rows:
            run_state = self.run_state[r.run_id]
            if run_state in TERMINAL_RUNS:
                assert r.state not in ACTIVE, f"run {r.run_id} is {run_state} but {r.task_id} is {r.state}"
        attempts = self._attempt_rows()
        # (5) one attempt row per (instance, attempt), never beyond the instance's attempt.
        per_attempt = Counter((a.task_instance_id, a.attempt) for a in attempts)
        twice = [k for k, n in per_attempt.items() if n > 1]
        assert not twice, f"attempts recorded twice: {twice}"
        current = {r.id: r for r in self.rows}
        for a in attempts:
            assert a.attempt <= current[a.task_instance_id].attempt, (
                f"attempt row {a} is ahead of its instance"
            )
        # (3) no double success: one per budget (each clear starts one).
        successes = Counter(
            (a.run_id, a.task_id) for a in attempts if a.outcome == AttemptOutcome.SUCCESS.value
        )
        for key, n in successes.items():
            assert n <= self.clears[key] + 1, f"{key} succeeded {n} times, cleared {self.clears[key]} times"
        # (I4) failures that spend the retry budget stay within it.
        for r in self.rows:
            spent = sum(
                1
                for a in attempts
                if a.task_instance_id == r.id and a.attempt > r.budget_base and a.outcome in SPENDING
            )
            assert spent <= RETRIES + 1, f"{r.run_id}/{r.task_id} spent {spent} attempts of {RETRIES + 1}"


def _run(url: str) -> None:
    runner = DagRunner(diamond, database_url=url)  # registers the DAG; its pool is the first
    second = Database(url, application_name="treadle-interleave-2")

    class OnThisDatabase(Interleavings):
        pools = (runner.db, second)

    try:
        run_state_machine_as_test(
            OnThisDatabase,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            ),
        )
    finally:
        runner.close()
        second.dispose()


#: Shrinking a failure replays many examples; leave it the time to report the shortest one.
SHRINK_TIMEOUT_S = 1200


@pytest.mark.postgres
@pytest.mark.timeout(SHRINK_TIMEOUT_S)
def test_interleavings_on_postgresql(pg_url: str) -> None:
    _run(pg_url)


@pytest.mark.mysql
@pytest.mark.timeout(SHRINK_TIMEOUT_S)
def test_interleavings_on_mariadb(mysql_url: str) -> None:
    _run(mysql_url)
