"""One execution slot: a long-lived child process and the thread that feeds it attempts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from treadle.domain.dag_version import DagVersion, TaskDef
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptDetails, AttemptError, ClaimedTask
from treadle.engine.datasets import OutletEvent, parse_outlet_events
from treadle.engine.execution import Ending, Reschedule, complete_attempt, fail_attempt
from treadle.observability.hooks import NO_HOOKS, Hooks
from treadle.observability.logging import attempt_context
from treadle.store.database import Database
from treadle.worker.attempt_log import AttemptFiles
from treadle.worker.child_process import ChildImports, ChildProcess
from treadle.worker.poking import Pokes, job_ended
from treadle.worker.protocol import (
    Message,
    receive,
    run_message,
    send,
    to_attempt_details,
    to_attempt_error,
)

log = logging.getLogger("treadle.worker")
#: Longest pause between two tries to record a held outcome (seconds).
MAX_RECORD_RETRY_S = 5.0


@dataclass(slots=True)
class Running:
    """The attempt a slot is running, whether its lease was lost, and whether the child is
    working on it (only then does a revocation kill the child)."""

    task: ClaimedTask
    revoked: bool = False
    in_child: bool = False
    #: Set when this worker revoked it itself, this many seconds after its last renewal.
    fenced_after_s: float | None = None
    #: Set once the database recorded the start. An attempt taken from the worker's buffer the
    #: moment the slot freed runs before that (its start is confirmed by the worker's next pass,
    #: and it is killed if the database refuses); its failure is written only after.
    confirmed: threading.Event = field(default_factory=threading.Event)


class Slot(threading.Thread):
    """Runs one attempt at a time in its child and reports the outcome, fenced by attempt."""

    def __init__(
        self,
        index: int,
        *,
        db: Database,
        worker_id: str,
        hostname: str,
        imports: ChildImports,
        version: Callable[[int], DagVersion],
        on_idle: Callable[[Slot], None],
        on_fenced: Callable[[ClaimedTask, float], None] | None = None,
        take_next: Callable[[Slot], ClaimedTask | None] | None = None,
        submit: Callable[[ClaimedTask, Any, Mapping[str, OutletEvent], AttemptDetails], None] | None = None,
        reschedule: Callable[[Reschedule], None] | None = None,
        files: AttemptFiles | None = None,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        super().__init__(name=f"treadle-slot-{index}", daemon=True)
        #: Told how each attempt ended and what became of a failed one (metrics).
        self.hooks = hooks
        self.db, self.worker_id, self.hostname = db, worker_id, hostname
        self.version = version
        self.on_idle = on_idle
        #: Hears of an attempt this worker stopped by self-fencing before it finished.
        self.on_fenced = on_fenced
        #: Gives the slot its next attempt at once when one waits in the worker's buffer (its
        #: start confirmed later, see `Running.confirmed`), setting `running` itself, so the
        #: confirmation cannot miss it; None: the slot goes idle.
        self.take_next = take_next or (lambda _slot: None)
        #: Hands a success with its outlet annotations to the worker, which records it with its
        #: next pass; the slot is free at once. By default it is recorded here, in its own
        #: transaction, before the slot takes another attempt.
        self.submit = submit or self._complete_alone
        #: Hands a poke's reschedule to the worker likewise; None: recorded here, on its own.
        self.reschedule = reschedule
        #: Where attempts keep their logs and run files (None: no log files, temporary manifests).
        self.files = files
        self.imports = imports
        #: Its task process, started by the slot's thread (slots start theirs in parallel).
        self.child: ChildProcess
        #: Set once the slot's task process started, or could not (`start_error` says why).
        self.prepared = threading.Event()
        self.start_error: BaseException | None = None
        self.pokes = Pokes(self)
        self.running: Running | None = None
        #: Moving average of the seconds this slot spends on one attempt, from taking it to being
        #: free again (None before its first); read by the worker to size its buffer.
        self.service_s: float | None = None
        self._assigned = threading.Event()
        self._stopping = threading.Event()
        self._abandoned = threading.Event()
        self._holding = threading.Event()

    def assign(self, task: ClaimedTask) -> None:
        """Give this idle slot an attempt to run (its start already recorded)."""
        running = Running(task=task)
        running.confirmed.set()
        self.running = running
        self._assigned.set()

    def go(self) -> None:
        """Run the attempt the worker put in `running` of this idle slot (one taken from its
        buffer, whose start its next pass records)."""
        self._assigned.set()

    def confirm(self, started: ClaimedTask) -> bool:
        """The database recorded the start of the attempt this slot took from the buffer; False
        if the slot is not running it (any more)."""
        current = self.running
        if current is None or (current.task.task_instance_id, current.task.attempt) != (
            started.task_instance_id,
            started.attempt,
        ):
            return False
        current.task = started
        current.confirmed.set()
        return True

    def revoke(
        self, task_instance_id: int, attempt: int, *, fenced_after_s: float | None = None
    ) -> ClaimedTask | None:
        """The lease is gone: kill the attempt at once and report nothing for it (self-fencing).

        `fenced_after_s` says the worker revoked it itself (no renewal for that long): if the
        kill stops it before it finished, `on_fenced` hears of it, to record it lost. Returns the
        attempt if this slot was running it.
        """
        current = self.running
        if current is None or (current.task.task_instance_id, current.task.attempt) != (
            task_instance_id,
            attempt,
        ):
            return None
        current.fenced_after_s = fenced_after_s
        current.revoked = True
        if current.in_child:
            self.child.signal_kill()
        return current.task

    def stop(self) -> None:
        """Stop after the current attempt and end the child."""
        self._stopping.set()
        self._assigned.set()

    def abandon(self) -> Running | None:
        """Stop now: kill the running attempt without reporting it; returns what it was running."""
        current = self.running
        self._abandoned.set()
        self.stop()
        if current is not None:
            current.revoked = True
        return current

    @property
    def holding_outcome(self) -> bool:
        """True while a finished attempt's outcome waits for the database to take it."""
        return self._holding.is_set()

    def prepare(self) -> bool:
        """Start the task process (in the slot's thread); False if it could not start."""
        try:
            self.child = ChildProcess(self.imports)
        except BaseException as exc:
            self.start_error = exc
            return False
        finally:
            self.prepared.set()
        return True

    def run(self) -> None:
        if not self.prepare():
            return
        self.on_idle(self)
        while not self._stopping.is_set():
            self._assigned.wait()
            self._assigned.clear()
            current = self.running
            while current is not None:
                took = time.monotonic()
                try:
                    with attempt_context(**_attempt_ids(current.task)):
                        self._execute(current)
                except Exception:  # last resort: the lease expires and the reaper records `lost`
                    log.exception(
                        "slot failed while running an attempt", extra={"event": "worker.slot_error"}
                    )
                self.running = current = None
                spent = time.monotonic() - took
                last = self.service_s
                self.service_s = spent if last is None else last + 0.3 * (spent - last)
                if self._stopping.is_set():
                    break
                if self.take_next(self) is not None:  # it set `running` before anyone could look
                    current = self.running
            if not self._stopping.is_set():
                self.on_idle(self)
        self.child.kill()

    def _execute(self, current: Running) -> None:
        task = current.task  # its start may be confirmed meanwhile: `current.task` then has it
        version = self.version(task.dag_version_id)
        definition = version.structure.tasks[task.task_id]
        message = self._message(task, version, definition)
        began = time.monotonic()
        deadline = began + task.timeout_s if task.timeout_s else None
        outcome = self._exchange(message, deadline, current)
        if outcome is None:  # revoked before it finished: report nothing for it
            if current.fenced_after_s is not None and self.on_fenced is not None:
                self.on_fenced(task, current.fenced_after_s)
            return
        if definition.sensor is not None:
            outcome = self.pokes.take(current, definition, message, outcome)
            if outcome is None:  # rescheduled or timed out: recorded
                return
        if outcome.get("ok"):
            try:
                annotations = parse_outlet_events(outcome.get("outlet_events"))
            except ValueError as exc:
                outcome = _invalid_outlet_events(str(exc))
            else:
                self._finished(task, AttemptOutcome.SUCCESS, began)
                # A lost attempt's report is discarded there.
                self.submit(current.task, outcome.get("value"), annotations, to_attempt_details(outcome))
                return
        error = to_attempt_error(outcome)
        kind = AttemptOutcome(outcome.get("outcome", AttemptOutcome.FAILED.value))
        if error.unknown_commit and kind is AttemptOutcome.FAILED:
            kind = AttemptOutcome.UNKNOWN_COMMIT
        self._finished(task, kind, began)
        # Failures are rare and worth a line; the attempt's ids come from its log context.
        log.info(
            "attempt failed",
            extra={"event": "worker.attempt_failed", "outcome": kind.value, "error_type": error.error_type},
        )
        if not self._await_confirmation(current):
            return  # the start was refused (revoked): the attempt is not this worker's to end
        task = current.task
        ending = self._record(
            task,
            lambda: fail_attempt(
                self.db,
                task,
                outcome=kind,
                error=error,
                worker_id=self.worker_id,
                hostname=self.hostname,
                forget_poll_state=job_ended(definition, error),
            ),
        )
        if ending is None:
            return
        self._observe_ending(task, kind, ending)
        self._callback(ending, definition.has_on_retry, definition.has_on_dead_letter, message, error)

    def _finished(self, task: ClaimedTask, outcome: AttemptOutcome, began: float) -> None:
        self.hooks.attempt_finished(
            dag_id=task.dag_id,
            task_id=task.task_id,
            outcome=outcome.value,
            duration_s=time.monotonic() - began,
        )

    def _observe_ending(self, task: ClaimedTask, outcome: AttemptOutcome, ending: Ending) -> None:
        """Tell the hooks what the recorded failure did: a retry, a dead letter or an inspection."""
        if not ending.applied or ending.decision is None:
            return
        if ending.decision.retry:
            self.hooks.attempt_retried(dag_id=task.dag_id, task_id=task.task_id)
        elif outcome is AttemptOutcome.UNKNOWN_COMMIT:
            self.hooks.attempt_needs_inspection(dag_id=task.dag_id, task_id=task.task_id)
        else:
            self.hooks.attempt_dead_lettered(dag_id=task.dag_id, task_id=task.task_id)

    def _message(self, task: ClaimedTask, version: DagVersion, definition: TaskDef) -> Message:
        """The request to run an attempt: its arguments, its files (log, manifest, outputs) and,
        for a poke, what the last poke left."""
        message = run_message(task, version)
        if self.files is not None:
            message |= self.files.message_fields(task)
        if definition.sensor is not None:
            message = self.pokes.message(task, message)
        return message

    def _await_confirmation(self, current: Running) -> bool:
        """Wait until the database recorded the attempt's start; False if it was revoked."""
        while not current.confirmed.wait(0.1):
            if current.revoked or self._abandoned.is_set():
                return False
        return not current.revoked

    def _record(self, task: ClaimedTask, write: Callable[[], Ending]) -> Ending | None:
        """Write a finished attempt's outcome, holding it through database outages and full disks.

        The write is fenced (worker id and attempt), so retrying it is safe for as long as it
        takes: it is applied while this worker still holds the attempt and discarded once another
        party took it. Meanwhile this slot stays busy, so the worker claims no new work it could
        not record either (backpressure). Only abandoning the slot (a hard stop) gives up.
        """
        delay = 0.25
        while True:
            try:
                ending = write()
            except Exception as exc:
                if self._abandoned.is_set():
                    log.error(
                        "outcome not recorded; the worker is stopping",
                        extra={"event": "worker.outcome_dropped", **_ids(task), "error": str(exc)[:300]},
                    )
                    return None
                self._holding.set()
                log.warning(
                    "cannot record the outcome yet; holding it and retrying",
                    extra={
                        "event": "worker.outcome_held",
                        **_ids(task),
                        "retry_in_s": delay,
                        "error": str(exc)[:300],
                    },
                )
                self._abandoned.wait(delay)
                delay = min(delay * 2, MAX_RECORD_RETRY_S)
                continue
            if self._holding.is_set():
                self._holding.clear()
                log.info("held outcome recorded", extra={"event": "worker.outcome_recorded", **_ids(task)})
            return ending

    def _complete_alone(
        self,
        task: ClaimedTask,
        value: Any,
        outlet_events: Mapping[str, OutletEvent],
        details: AttemptDetails,
    ) -> None:
        self._record(task, lambda: self._write_success(task, value, outlet_events, details))

    def _write_success(
        self,
        task: ClaimedTask,
        value: Any,
        outlet_events: Mapping[str, OutletEvent],
        details: AttemptDetails,
    ) -> Ending:
        return complete_attempt(
            self.db,
            task,
            worker_id=self.worker_id,
            hostname=self.hostname,
            value=value,
            outlet_events=outlet_events,
            details=details,
        )

    def _exchange(self, message: Message, deadline: float | None, current: Running) -> Message | None:
        """Send an attempt to the child and wait for its reply, the deadline, or revocation."""
        if not self.child.process.is_alive():  # died while idle (OOM killer, an operator)
            self.child.restart()
        assert self.child.conn is not None
        current.in_child = True
        try:
            return self._await_reply(message, deadline, current)
        finally:
            current.in_child = False

    def _await_reply(self, message: Message, deadline: float | None, current: Running) -> Message | None:
        assert self.child.conn is not None
        send(self.child.conn, message)
        while True:
            wait = 0.5 if deadline is None else max(min(deadline - time.monotonic(), 0.5), 0)
            try:
                if self.child.conn.poll(wait):
                    return receive(self.child.conn)
            except (EOFError, OSError):
                if current.revoked:  # killed by a revocation, not by the task
                    self.child.kill() if self._stopping.is_set() else self.child.restart()
                    return None
                description = self.child.exit_description()
                self.child.restart()
                return {
                    "ok": False,
                    "error_type": "ChildProcessDied",
                    "message": description,
                    "frame": "",
                    "traceback": "",
                }
            if current.revoked:
                # Stopping: end the child for good; otherwise replace it for the next attempt.
                self.child.kill() if self._stopping.is_set() else self.child.restart()
                return None
            if deadline is not None and time.monotonic() >= deadline:
                self.child.restart()
                return {
                    "ok": False,
                    "outcome": AttemptOutcome.TIMED_OUT.value,
                    "error_type": "TaskTimeout",
                    "frame": "",
                    "traceback": "",
                    "message": f"exceeded its timeout of {current.task.timeout_s} s; "
                    "the process group was killed",
                }

    def _callback(
        self,
        ending: Ending,
        has_on_retry: bool,
        has_on_dead_letter: bool,
        message: Message,
        error: AttemptError,
    ) -> None:
        if not ending.applied or ending.decision is None:
            return
        name = "on_retry" if ending.decision.retry else "on_dead_letter"
        if not (has_on_retry if ending.decision.retry else has_on_dead_letter):
            return
        assert self.child.conn is not None
        send(
            self.child.conn,
            message
            | {
                "kind": "callback",
                "callback": name,
                "error": {"error_type": error.error_type, "message": error.message},
            },
        )
        try:
            if self.child.conn.poll(60):
                receive(self.child.conn)
            else:
                self.child.restart()
        except (EOFError, OSError):
            self.child.restart()


def _attempt_ids(task: ClaimedTask) -> dict[str, object]:
    """What every log line about this attempt carries (observability/logging.py)."""
    return {
        "run_id": task.run_id,
        "dag_id": task.dag_id,
        "task_id": task.task_id,
        "map_index": task.map_index,
        "attempt": task.attempt,
    }


def _ids(task: ClaimedTask) -> dict[str, object]:
    return {"task_instance_id": task.task_instance_id, "attempt": task.attempt, "run_id": task.run_id}


def _invalid_outlet_events(problem: str) -> Message:
    """The failure of an attempt whose reply carried malformed outlet annotations (not retried)."""
    return {
        "ok": False,
        "error_type": "OutletEventInvalid",
        "message": problem,
        "frame": "",
        "traceback": "",
        "retryable": False,
    }
