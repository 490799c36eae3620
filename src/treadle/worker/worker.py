"""The worker process: a claim loop bounded by free slots, a heartbeat thread, a self-fencing
watchdog, DAG refresh."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from treadle.authoring.loader import folder_signature
from treadle.config import Settings
from treadle.domain.dag_version import DagVersion
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptDetails, AttemptError, ClaimedTask
from treadle.engine.dags import SyncReport, sync_dags
from treadle.engine.datasets import OutletEvent
from treadle.engine.execution import (
    Cycle,
    Ending,
    Reschedule,
    Success,
    extend_leases,
    fail_attempt,
    hand_back_attempts,
    work_cycle,
)
from treadle.engine.sensing import ORPHANED_JOB, owe_job_cancel
from treadle.engine.versions import version_of
from treadle.engine.workers import record_worker, touch_worker
from treadle.observability.hooks import NO_HOOKS, Hooks
from treadle.store.database import Database, is_transient
from treadle.store.dialects import CANCEL_CHANNEL, READY_CHANNEL
from treadle.store.notifications import listen
from treadle.worker.attempt_log import AttemptFiles
from treadle.worker.child_process import ChildImports, prestart
from treadle.worker.dag_processor import ParsedFolder, parse_folder
from treadle.worker.fencing import FencedAttempts, LeaseClock
from treadle.worker.job_cancels import CANCEL_LIMIT_S, JobCanceller
from treadle.worker.run_files import RUN_FILES_SWEEP_S, remove_files_of_pruned_runs
from treadle.worker.slot import Running, Slot

log = logging.getLogger("treadle.worker")

#: Longest pause between two tries of a dispatch pass that could not commit (seconds).
MAX_CYCLE_RETRY_S = 5.0
#: Seconds a stopping worker keeps trying to record the successes it holds.
FLUSH_ON_STOP_S = 10.0
#: The default buffer holds what the slots can finish during this many dispatch passes...
BUFFER_HORIZON_PASSES = 2
#: ...and nothing when that is less than this share of one attempt (attempts that take more than
#: twenty passes gain little from waiting at hand, and are better left to idle workers).
MIN_BUFFERED_SHARE = 0.1
#: A renewal that skipped rows another transaction held tries them again after this share of a
#: heartbeat: such a hold lasts one transaction, and waiting a whole heartbeat would spend one
#: of the few renewals a lease allows before the watchdog fences.
SKIPPED_RETRY_SHARE = 0.1


def sync_dag_folder(db: Database, folder: Path, *, file_limit_s: float) -> tuple[SyncReport, ParsedFolder]:
    """Import the DAG folder in processor processes (each file within `file_limit_s`) and register
    what it holds (structures and per-file errors)."""
    parsed = parse_folder(folder, file_limit_s=file_limit_s)
    report = sync_dags(
        db,
        structures=list(parsed.structures.values()),
        scanned_files=parsed.files,
        errors=parsed.errors,
        folder=str(folder),
    )
    return report, parsed


class Worker:
    """Claims queued attempts up to its free slots and runs each in a child process."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        concurrency: int,
        queues: list[str],
        worker_id: str | None = None,
        poll_s: float = 1.0,
        prefetch: int = 0,
        adaptive_prefetch: bool = False,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        self.db, self.settings = db, settings
        #: Told of starts, outcomes and refusals (metrics); no-ops unless a process sets them.
        self.hooks = hooks
        self.concurrency, self.queues, self.poll_s = concurrency, queues, poll_s
        #: Attempts claimed ahead of a free slot (they hold a lease and are heartbeated, but are
        #: started only when a slot takes them). Guarded by `_buffer_lock`.
        self.prefetch = prefetch
        #: With `adaptive_prefetch`, `prefetch` is a ceiling: the buffer holds what the slots
        #: finish while the next passes run (`BufferSizer`), so long tasks stay queued for
        #: other workers and short ones never leave a slot waiting on a pass.
        self.sizer = BufferSizer() if adaptive_prefetch else None
        self.prefetched: collections.deque[ClaimedTask] = collections.deque()
        self._buffer_lock = threading.Lock()
        #: Successes and pokes' reschedules handed over by slots and not yet committed, by (task
        #: instance, attempt): the slot is free at once; the dispatch loop records them with its
        #: next claim. Their leases are renewed until then. Guarded by `_buffer_lock`.
        self.unrecorded: dict[tuple[int, int], Success | Reschedule] = {}
        #: Consecutive dispatch round trips that failed (outcomes held meanwhile).
        self.failed_cycles = 0
        #: Where a committed cancellation wakes the worker at once (PostgreSQL's NOTIFY, SQLite's
        #: wake-up sockets), a slot that frees takes its next attempt from the buffer and runs it
        #: at once; the start is confirmed by the next pass, which kills it if the database
        #: refuses (cancelled or lost meanwhile). Elsewhere (MariaDB) a buffered attempt runs only
        #: after its start is recorded.
        self.start_at_once = db.supports_wakeups
        #: Attempts slots took from the buffer, waiting for their start to be recorded (and
        #: the start times recorded for those whose success is not yet). Guarded by `_buffer_lock`.
        self.starting: dict[tuple[int, int], ClaimedTask] = {}
        #: Buffered attempts the pass in flight is starting for idle slots (slots take others).
        self.reserved: set[tuple[int, int]] = set()
        self.start_times: dict[tuple[int, int], datetime] = {}
        #: When each held attempt stops being trusted (self-fencing, F2).
        self.leases = LeaseClock(lease_s=settings.lease_s, margin_s=settings.heartbeat_s)
        self.fenced = FencedAttempts()
        #: Heartbeats use a pool of their own, never queued behind the slots' connections, whose
        #: statements give up in time for a second try before the worker stops trusting a lease.
        self.heartbeat_db = Database(
            db.url,
            application_name="treadle-heartbeat",
            pool_size=1,
            statement_timeout_s=max((settings.lease_s - settings.heartbeat_s) / 2, 0.5),
        )
        # Both plan with indexes: the hot statements are prepared once (see prefer_index_scans).
        db.prefer_index_scans()
        self.heartbeat_db.prefer_index_scans()
        # It records self-fenced attempts too, which may dead-letter: their alerts need the sinks.
        self.heartbeat_db.outbox_sinks = db.outbox_sinks
        self.heartbeat_db.alerting = db.alerting
        self.heartbeat_db.lineage_namespace = db.lineage_namespace
        self.hostname = socket.gethostname()
        self.worker_id = worker_id or f"{self.hostname}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        #: Set when the worker stops claiming; `closed` when it stops heartbeating too.
        self.stopping = threading.Event()
        self.closed = threading.Event()
        self.wake = threading.Event()
        #: Set to renew leases (and so notice cancelled attempts) before the next heartbeat.
        self.beat_now = threading.Event()
        self.idle: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self.slots: list[Slot] = []
        self._signature: tuple[tuple[str, int, int], ...] = ()
        #: DAG files that did not import within the limit: task processes do not import them.
        self.slow_files: frozenset[str] = frozenset()
        self.job_canceller: JobCanceller | None = None
        #: Set once the DAG folder was read and synced (readiness).
        self.dags_loaded = False
        #: Set once its task processes are up and it claims (`starting` until then).
        self.claiming = False

    def version(self, version_id: int) -> DagVersion:
        """Return a DAG version (cached)."""
        cached = self.db.version_cache.get(version_id)
        if cached is not None:
            return cached
        return self.db.query(lambda conn: version_of(self.db, conn, version_id))

    def start(self) -> None:
        """Register this worker (`starting`), start its slots' task processes in parallel, start
        the helper threads, then record it `running`: it claims from then on.

        Neither waits for the DAG folder: the fork server imports it file by file in the
        background (a task process forked before it finished imports the file its attempt needs),
        and the folder is synced with the registry by the refresh thread, first thing.
        """
        settings = self.settings
        prestart(settings.dags_folder, settings.max_result_bytes, settings.dag_import_timeout_s)
        record_worker(
            self.db,
            worker_id=self.worker_id,
            hostname=self.hostname,
            pid=os.getpid(),
            queues=self.queues,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            state="starting",
        )
        threading.Thread(target=self._refresh_loop, name="treadle-dag-refresh", daemon=True).start()
        for i in range(self.concurrency):
            slot = Slot(
                i,
                db=self.db,
                worker_id=self.worker_id,
                hostname=self.hostname,
                imports=ChildImports(
                    folder=self.settings.dags_folder,
                    max_result_bytes=self.settings.max_result_bytes,
                    file_limit_s=self.settings.dag_import_timeout_s,
                    skip=lambda: self.slow_files,
                ),
                version=self.version,
                on_idle=self._slot_idle,
                on_fenced=self._fenced_stop,
                take_next=self._take_buffered,
                submit=self._submit_success,
                reschedule=self._submit_reschedule,
                files=AttemptFiles.of(self.settings),
                hooks=self.hooks,
            )
            self.slots.append(slot)
            slot.start()  # its thread starts its task process, alongside the others
        began = time.monotonic()
        for slot in self.slots:
            slot.prepared.wait()
        failed = next((s.start_error for s in self.slots if s.start_error is not None), None)
        if failed is not None:
            self.stopping.set()
            for slot in self.slots:
                slot.stop()
            try:
                touch_worker(self.db, self.worker_id, state="stopped")
            except Exception:
                log.exception("could not record the stop", extra={"event": "worker.stop_error"})
            raise failed
        log.info(
            "task processes started",
            extra={
                "event": "worker.slots_ready",
                "slots": len(self.slots),
                "duration_s": round(time.monotonic() - began, 3),
            },
        )
        # Owed cancels of submitted jobs (cancelled submit-then-poll tasks), in a process of their own.
        self.job_canceller = JobCanceller(
            db=self.db,
            worker_id=self.worker_id,
            queues=self.queues,
            imports=ChildImports(
                folder=self.settings.dags_folder,
                max_result_bytes=self.settings.max_result_bytes,
                file_limit_s=self.settings.dag_import_timeout_s,
                skip=lambda: self.slow_files,
            ),
            version=self.version,
            poll_s=max(self.poll_s, 1.0),
            lease_s=self.settings.lease_s,
            stop=self.stopping,
        )
        self.job_canceller.start()
        threading.Thread(target=self._heartbeat_loop, name="treadle-heartbeat", daemon=True).start()
        threading.Thread(target=self._watchdog_loop, name="treadle-watchdog", daemon=True).start()
        if self.settings.retention_days > 0:
            threading.Thread(target=self._run_files_loop, name="treadle-run-files", daemon=True).start()
        if self.db.supports_wakeups:
            handlers = {READY_CHANNEL: self.wake.set, CANCEL_CHANNEL: self._cancel_heard}
            threading.Thread(
                target=listen,
                name="treadle-listen",
                daemon=True,
                kwargs={"url": self.db.url, "handlers": handlers, "stop": self.closed},
            ).start()
        self.claiming = True
        touch_worker(self.db, self.worker_id, state="running")
        log.info(
            "worker started",
            extra={
                "event": "worker.started",
                "worker_id": self.worker_id,
                "concurrency": self.concurrency,
                "queues": self.queues,
            },
        )

    def _cancel_heard(self) -> None:
        """A cancellation committed: renew leases now (killing cancelled attempts), and look for
        owed job cancels."""
        self.beat_now.set()
        if self.job_canceller is not None:
            self.job_canceller.wake.set()

    def refresh_dags(self) -> bool:
        """Re-register the DAG folder if any file changed; returns True if it synced."""
        signature = folder_signature(self.settings.dags_folder)
        if signature == self._signature:
            return False
        report, parsed = sync_dag_folder(
            self.db, self.settings.dags_folder, file_limit_s=self.settings.dag_import_timeout_s
        )
        self.slow_files = parsed.timed_out
        self._signature = signature
        log.info(
            "dags synced",
            extra={"event": "dags.synced", "dags": report.dags, "errors": report.errors},
        )
        return True

    def run(self) -> None:
        """Claim and dispatch until stopped (call start() first).

        Each pass is one transaction (`work_cycle`): start buffered attempts for idle slots,
        record the successes slots handed over since the last pass, and claim up to the free
        capacity. Slots never wait for their success to commit; a pass takes whatever piled up
        meanwhile, so under load the work of several slots shares each round trip.
        """
        hungry = True  # whether a claim may find work (cleared when one came back short)
        delay = 0.25
        while not self.stopping.is_set():
            # Read before the outcomes: an attempt a slot ends meanwhile is then in `unrecorded`.
            in_slots = [r.task for r in (slot.running for slot in self.slots) if r is not None]
            with self._buffer_lock:
                successes, pokes = _split([self._with_start_time(s) for s in self.unrecorded.values()])
                buffered = len(self.prefetched)
                taken = list(self.starting.values())
                busy = _busy_runs(in_slots, self.prefetched, self.unrecorded)
            idle = self.idle.qsize()
            starts = min(idle, buffered)
            # Bounded admission: never more than `concurrency` running plus `prefetch` waiting.
            ahead = (
                self.prefetch
                if self.sizer is None
                else self.sizer.target(self.prefetch, [slot.service_s for slot in self.slots])
            )
            want = (idle - starts) + max(ahead - (buffered - starts), 0) if hungry else 0
            if not successes and not pokes and not starts and not want and not taken:
                self.wake.wait(self.poll_s)
                self.wake.clear()
                hungry = True
                continue
            with self._buffer_lock:
                to_start = list(itertools.islice(self.prefetched, starts))
                # Reserved for this pass: a slot that frees meanwhile takes another one.
                self.reserved = {(t.task_instance_id, t.attempt) for t in to_start}
            began = time.monotonic()
            try:
                cycle = self._cycle(
                    successes,
                    pokes,
                    to_start=to_start,
                    taken=taken,
                    want=want,
                    start_new=idle - starts,
                    busy_runs=busy,
                )
            except Exception as exc:
                with self._buffer_lock:
                    self.reserved = set()
                self._cycle_failed(exc, successes, pokes)
                self.stopping.wait(delay)
                # At least once a heartbeat: held outcomes go in soon after the database is back.
                delay = min(delay * 2, MAX_CYCLE_RETRY_S, self.settings.heartbeat_s)
                continue
            delay = 0.25
            if self.sizer is not None:
                self.sizer.observe(time.monotonic() - began)
            self._apply(cycle, successes, pokes, to_start, taken)
            hungry = _still_hungry(hungry, want=want, cycle=cycle, queues=self.queues)

    def _cycle(
        self,
        successes: list[Success],
        pokes: list[Reschedule],
        *,
        to_start: list[ClaimedTask],
        want: int,
        start_new: int,
        taken: list[ClaimedTask] | None = None,
        busy_runs: frozenset[str] = frozenset(),
    ) -> Cycle:
        sent = time.monotonic()
        cycle = work_cycle(
            self.db,
            successes=successes,
            reschedules=pokes,
            busy_runs=busy_runs,
            start=to_start + (taken or []),
            claim_limit=want,
            claim_start=start_new,
            worker_id=self.worker_id,
            hostname=self.hostname,
            queues=self.queues,
            lease_s=self.settings.lease_s,
            attempts=2,  # this loop is the retry, with backoff, holding what it has
        )
        self.leases.granted(((t.task_instance_id, t.attempt) for t in cycle.claimed), sent_at=sent)
        return cycle

    def _apply(
        self,
        cycle: Cycle,
        successes: list[Success],
        pokes: list[Reschedule],
        to_start: list[ClaimedTask],
        taken: list[ClaimedTask] | None = None,
    ) -> None:
        """Hand what a committed pass started to idle slots, buffer the rest, forget the recorded.

        A buffered attempt revoked while the pass was in flight (no longer in the buffer) is not
        run even if the pass started it: the revocation already dealt with it.
        """
        taken = taken or []
        confirmed = cycle.started[len(to_start) :]
        with self._buffer_lock:
            for pair in map(_pair, [*successes, *pokes]):
                self.unrecorded.pop(pair, None)
                self.start_times.pop(pair, None)
            for took, started in zip(taken, confirmed, strict=True):
                pair = (took.task_instance_id, took.attempt)
                self.starting.pop(pair, None)
                if started is not None and started.started_at is not None:
                    # Kept until its success is recorded: the slot may hand the success over
                    # before it hears of the confirmation.
                    self.start_times[pair] = started.started_at
            still = {(t.task_instance_id, t.attempt) for t in self.prefetched}
            asked = {(t.task_instance_id, t.attempt) for t in to_start}
            self.prefetched = collections.deque(
                t for t in self.prefetched if (t.task_instance_id, t.attempt) not in asked
            )
            self.reserved = set()
        if self.failed_cycles:
            log.info(
                "held outcomes recorded",
                extra={"event": "worker.outcome_recorded", "count": len(successes) + len(pokes)},
            )
            self.failed_cycles = 0
        for item, ending in zip([*successes, *pokes], [*cycle.endings, *cycle.rescheduled], strict=True):
            self._recorded(item, ending)
        self._confirm(taken, confirmed)
        self._forget_start_times()
        self._observe(cycle)
        for buffered, task in zip(to_start, cycle.started[: len(to_start)], strict=True):
            if task is not None and (task.task_instance_id, task.attempt) in still:
                self.idle.get().assign(task)
            elif task is None:
                self.leases.forget((buffered.task_instance_id, buffered.attempt))
                log.info(
                    "buffered attempt no longer held; not started",
                    extra={
                        "event": "worker.buffered_dropped",
                        "task_instance_id": buffered.task_instance_id,
                        "attempt": buffered.attempt,
                    },
                )
        for task in cycle.claimed:
            if task.started_at is not None:  # started by the claim: at most the idle slots
                self.idle.get().assign(task)
            else:
                self._buffer(task)
        self._idle_slots_take_buffered()

    def _idle_slots_take_buffered(self) -> None:
        """Slots that freed while the pass ran, when the buffer was empty, take what it brought
        at once, as a slot that frees with the buffer full does, instead of idling until the
        next pass starts an attempt for them."""
        while True:
            try:
                slot = self.idle.get_nowait()
            except queue.Empty:
                return
            if self._take_buffered(slot) is None:
                self.idle.put(slot)
                return
            slot.go()

    def _buffer(self, task: ClaimedTask) -> None:
        """Put a claimed attempt in the buffer: pokes behind every other attempt.

        A sensor's poke is due within its poke interval, not at once: an attempt claimed after a
        buffer full of pokes still goes to the next free slot before them.
        """
        poke = _is_poke(self.version(task.dag_version_id), task)
        with self._buffer_lock:
            if poke:
                self.prefetched.append(task)
                return
            # Buffered attempts' versions are cached (looked up as they came in): no query here.
            cache = self.db.version_cache
            at = next(
                (
                    i
                    for i, t in enumerate(self.prefetched)
                    if (v := cache.get(t.dag_version_id)) is not None and _is_poke(v, t)
                ),
                len(self.prefetched),
            )
            self.prefetched.insert(at, task)

    def _observe(self, cycle: Cycle) -> None:
        """Tell the hooks how long the attempts this pass started waited, and what it refused."""
        for task in itertools.chain(cycle.started, cycle.claimed):
            if task is not None and task.started_at is not None and task.queued_at is not None:
                delay_s = (task.started_at - task.queued_at).total_seconds()
                self.hooks.attempt_started(dag_id=task.dag_id, delay_s=delay_s)
        for reason, count in cycle.refused.items():
            self.hooks.admission_refused(reason=reason, count=count)

    @property
    def load(self) -> tuple[int, int]:
        """Attempts running in slots and attempts waiting in the buffer, now."""
        active = sum(1 for slot in self.slots if slot.running is not None)
        with self._buffer_lock:
            return active, len(self.prefetched)

    def _cycle_failed(self, exc: Exception, successes: list[Success], pokes: list[Reschedule]) -> None:
        """A pass did not commit: keep every outcome (backpressure: nothing new is claimed until
        they are recorded); a bad one among several is written alone so it cannot sink the rest."""
        self.failed_cycles += 1
        log.warning(
            "cannot record outcomes or claim yet; holding them and retrying",
            extra={
                "event": "worker.outcome_held",
                "held_outcomes": len(successes) + len(pokes),
                "failed_passes": self.failed_cycles,
                "error": str(exc)[:300],
            },
        )
        if len(successes) + len(pokes) > 1 and not is_transient(exc):
            for item in [*successes, *pokes]:
                alone = _split([item])
                try:
                    cycle = self._cycle(*alone, to_start=[], want=0, start_new=0)
                except Exception:
                    continue
                with self._buffer_lock:
                    self.unrecorded.pop(_pair(item), None)
                [ending] = [*cycle.endings, *cycle.rescheduled]
                self._recorded(item, ending)

    def _take_buffered(self, slot: Slot) -> ClaimedTask | None:
        """A slot freed: its next attempt from the buffer, to run at once (see `start_at_once`),
        if the worker trusts its lease for at least another heartbeat; else None (idle)."""
        if not self.start_at_once or self.stopping.is_set():
            return None
        now = time.monotonic()
        with self._buffer_lock:
            task = next(
                (t for t in self.prefetched if (t.task_instance_id, t.attempt) not in self.reserved), None
            )
            if task is None:
                return None
            pair = (task.task_instance_id, task.attempt)
            deadline = self.leases.deadline(pair)
            if deadline is None or deadline - now < self.settings.heartbeat_s:
                return None  # the dispatch loop starts it, once the database confirms
            self.prefetched.remove(task)
            self.starting[pair] = task
            slot.running = Running(task=task)
        self.wake.set()
        return task

    def _confirm(self, taken: list[ClaimedTask], confirmed: list[ClaimedTask | None]) -> None:
        """Tell the slots which of the attempts they took from the buffer may run on."""
        for asked, started in zip(taken, confirmed, strict=True):
            pair = (asked.task_instance_id, asked.attempt)
            if started is not None and any(slot.confirm(started) for slot in self.slots):
                continue
            if started is None:
                self.revoke(pair, reason="start refused: the attempt is no longer this worker's")

    def _forget_start_times(self) -> None:
        """Drop the start times of attempts that ended without a success to record."""
        running = {(r.task.task_instance_id, r.task.attempt) for r in (s.running for s in self.slots) if r}
        with self._buffer_lock:
            for pair in [p for p in self.start_times if p not in self.unrecorded and p not in running]:
                self.start_times.pop(pair, None)

    def _with_start_time(self, item: Success | Reschedule) -> Success | Reschedule:
        """An outcome whose start was confirmed after the slot handed it over, with that time."""
        task = item.task if isinstance(item, Reschedule) else item[0]
        at = self.start_times.get((task.task_instance_id, task.attempt))
        if task.started_at is not None or at is None:
            return item
        if isinstance(item, Reschedule):
            return dataclasses.replace(item, task=dataclasses.replace(task, started_at=at))
        return (dataclasses.replace(task, started_at=at), *item[1:])

    def _submit_success(
        self,
        task: ClaimedTask,
        value: Any,
        outlet_events: Mapping[str, OutletEvent],
        details: AttemptDetails,
    ) -> None:
        """A slot's attempt succeeded: the next pass records it (the slot is free at once)."""
        with self._buffer_lock:
            self.unrecorded[(task.task_instance_id, task.attempt)] = (task, value, outlet_events, details)
        # No wake-up here: the slot next takes a buffered attempt or goes idle, and either wakes
        # the dispatch loop, which then sees the success and the free slot in one pass.

    def _submit_reschedule(self, poke: Reschedule) -> None:
        """A slot's poke asks for another: the next pass records it (the slot is free at once)."""
        with self._buffer_lock:
            self.unrecorded[(poke.task.task_instance_id, poke.task.attempt)] = poke

    def _recorded(self, item: Success | Reschedule, ending: Ending) -> None:
        """A held outcome went in: its lease is no longer renewed; a poke's job whose attempt
        was no longer ours is owed a cancel."""
        if ending.applied:
            self.leases.forget(_pair(item))
        elif isinstance(item, Reschedule) and item.submitted:
            self._owe_orphaned_job(item)

    def _owe_orphaned_job(self, poke: Reschedule) -> None:
        """A poke submitted a job, but its attempt was no longer this worker's when the reschedule
        was recorded: nobody will poll the job, so a worker must cancel it."""
        task = poke.task
        log.warning(
            "submitted job of a lost attempt; owing its cancel",
            extra={
                "event": "job.orphaned",
                "task_instance_id": task.task_instance_id,
                "attempt": task.attempt,
            },
        )
        queue = self.version(task.dag_version_id).structure.tasks[task.task_id].queue
        try:
            owe_job_cancel(self.db, task, handle=poke.state, queue=queue, reason=ORPHANED_JOB)
        except Exception:
            log.exception("could not record the owed cancel", extra={"event": "job.orphaned_error"})

    @property
    def holding_outcomes(self) -> int:
        """Outcomes waiting to be recorded while passes fail (0 when the database takes them)."""
        with self._buffer_lock:
            return len(self.unrecorded) if self.failed_cycles else 0

    def stop(self, *, grace_s: float = 0.0, hard: threading.Event | None = None) -> int:
        """Stop claiming; give running attempts `grace_s` to finish (less if `hard` is set), then
        kill the rest and hand them back to the queue without spending a retry.

        Leases keep being renewed during the grace period. Returns how many were handed back.
        """
        self.stopping.set()
        self.wake.set()
        for slot in self.slots:
            slot.stop()
        deadline = time.monotonic() + grace_s
        hard = hard or threading.Event()
        while any(s.running for s in self.slots) and time.monotonic() < deadline and not hard.is_set():
            hard.wait(0.1)
        abandoned = [r.task for r in (s.abandon() for s in self.slots) if r is not None]
        with self._buffer_lock:
            abandoned.extend(self.prefetched)  # never started: handed back as they are
            self.prefetched.clear()
        for slot in self.slots:
            slot.join(timeout=10)  # each kills its child before it ends
        if self.job_canceller is not None:
            self.job_canceller.wake.set()
            self.job_canceller.join(timeout=CANCEL_LIMIT_S + 5)
        self._flush(deadline=time.monotonic() + (0 if hard.is_set() else FLUSH_ON_STOP_S))
        handed = 0
        try:
            if abandoned:
                handed = hand_back_attempts(
                    self.db, abandoned, worker_id=self.worker_id, hostname=self.hostname
                )
            touch_worker(self.db, self.worker_id, state="stopped")
        except Exception:
            # Not fatal: the leases expire and the reaper records the attempts `lost` instead.
            log.exception("could not hand back or record the stop", extra={"event": "worker.stop_error"})
        self.closed.set()
        self.heartbeat_db.dispose()
        log.info(
            "worker stopped",
            extra={"event": "worker.stopped", "worker_id": self.worker_id, "handed_back": handed},
        )
        return handed

    def _flush(self, *, deadline: float) -> None:
        """Record the successes still held (the dispatch loop has stopped), until `deadline`."""
        delay = 0.25
        while True:
            with self._buffer_lock:
                successes, pokes = _split(list(self.unrecorded.values()))
            if not successes and not pokes:
                return
            try:
                cycle = self._cycle(successes, pokes, to_start=[], want=0, start_new=0)
            except Exception as exc:
                if time.monotonic() + delay > deadline:
                    log.error(
                        "outcomes not recorded; the worker is stopping",
                        extra={
                            "event": "worker.outcome_dropped",
                            "count": len(successes) + len(pokes),
                            "error": str(exc)[:300],
                        },
                    )
                    return
                time.sleep(delay)
                delay = min(delay * 2, MAX_CYCLE_RETRY_S)
                continue
            self._apply(cycle, successes, pokes, [])

    def _slot_idle(self, slot: Slot) -> None:
        self.idle.put(slot)
        self.wake.set()

    def _refresh_loop(self) -> None:
        """Re-register edited DAG files, in a thread of its own: the claim loop never waits on an
        import (each runs in processor processes, every file within its time limit)."""
        while not self.stopping.is_set():
            try:
                self.refresh_dags()
            except Exception:
                log.exception("dag refresh failed", extra={"event": "dags.sync_error"})
            else:
                self.dags_loaded = True
            if self.stopping.wait(self.settings.dag_refresh_s):
                return

    def _run_files_loop(self) -> None:
        """Remove this host's files of runs that retention pruned (worker/run_files.py)."""
        while not self.stopping.wait(RUN_FILES_SWEEP_S):
            try:
                remove_files_of_pruned_runs(
                    self.db, runs_dir=self.settings.runs_dir, logs_dir=self.settings.logs_dir
                )
            except Exception:
                log.exception("run files sweep failed", extra={"event": "worker.run_files_error"})

    def _heartbeat_loop(self) -> None:
        # Beats start a heartbeat apart, however long each takes: counted from when the last one
        # ended, slow renewals would drift later while the watchdog's deadline does not.
        due = time.monotonic() + self.settings.heartbeat_s
        while not self.closed.is_set():
            self.beat_now.wait(max(due - time.monotonic(), 0.0))
            self.beat_now.clear()
            if not self.closed.is_set():
                began = time.monotonic()
                skipped = self._heartbeat_once()
                due = began + self.settings.heartbeat_s * (SKIPPED_RETRY_SHARE if skipped else 1.0)

    def _held(self) -> tuple[list[tuple[int, int]], int]:
        """The attempts this worker holds (running, then buffered) and how many are buffered."""
        held = [(r.task.task_instance_id, r.task.attempt) for r in (s.running for s in self.slots) if r]
        with self._buffer_lock:
            held.extend(self.unrecorded)  # finished, not yet recorded: still ours until then
            held.extend(p for p in self.starting if p not in held)
            waiting = [(t.task_instance_id, t.attempt) for t in self.prefetched]
        return held + waiting, len(waiting)

    def _heartbeat_once(self) -> bool:
        """Renew the held leases and report the worker's state; True if rows were skipped."""
        held, waiting = self._held()
        sent = time.monotonic()
        skipped: set[int] = set()
        try:
            renewed, skipped = extend_leases(
                self.heartbeat_db,
                worker_id=self.worker_id,
                held=held,
                lease_s=self.settings.lease_s,
                attempts=1,  # the next heartbeat is the retry; the watchdog fences meanwhile
            )
        except Exception:
            log.exception("lease renewal failed", extra={"event": "worker.heartbeat_error"})
        else:
            self.leases.granted(renewed, sent_at=sent)
            for pair in set(held) - renewed:  # cancelled, reaped or lost: stop it, start nothing
                if pair[0] not in skipped:  # a row another transaction held: next time
                    self.revoke(pair, reason="lease no longer held")
            self._record_fenced()
        held_outcomes = sum(slot.holding_outcome for slot in self.slots) + self.holding_outcomes
        if held_outcomes:
            # Backpressure: those slots claim nothing until the database takes their outcomes.
            log.warning(
                "outcomes waiting to be recorded; their slots claim no new work",
                extra={"event": "worker.backpressure", "held_outcomes": held_outcomes},
            )
        try:
            touch_worker(
                self.heartbeat_db,
                self.worker_id,
                state=self.state,
                active=len(held) - waiting,
                prefetched=waiting,
            )
        except Exception:
            log.exception("heartbeat failed", extra={"event": "worker.heartbeat_error"})
        return bool(skipped)

    @property
    def state(self) -> str:
        """What the workers table says of it: starting (cannot claim yet), running, stopping."""
        if self.stopping.is_set():
            return "stopping"
        return "running" if self.claiming else "starting"

    def _fenced_stop(self, task: ClaimedTask, silent_s: float) -> None:
        self.fenced.add(task, silent_s=silent_s)

    def _record_fenced(self) -> None:
        """Record `lost`, with the reason, the attempts this worker stopped by self-fencing."""
        for task, silent_s in self.fenced.pending():
            error = AttemptError(
                error_type="SelfFenced",
                message=f"worker {self.worker_id} on {self.hostname} could not renew its lease for "
                f"{silent_s:.1f} s (database unreachable or slow) and stopped the attempt before the "
                "lease could expire",
                frame="treadle.worker",
            )
            try:
                fail_attempt(
                    self.heartbeat_db,
                    task,
                    outcome=AttemptOutcome.LOST,
                    error=error,
                    worker_id=self.worker_id,
                    hostname=self.hostname,
                    report_late=False,  # another party ended it first: nothing to add
                )
            except Exception:
                log.exception(
                    "could not record a self-fenced attempt", extra={"event": "worker.fence_record_error"}
                )
                return  # the next heartbeat tries again
            self.fenced.done(task)

    def _watchdog_loop(self) -> None:
        """Self-fence (F2): kill every held attempt whose last successful claim or renewal was sent
        longer ago than the lease minus one heartbeat, however long the call renewing it blocks.

        Sleeps until the earliest such deadline, a grant due sooner, or one heartbeat (to notice
        `closed`): no periodic wake-ups while idle."""
        while not self.closed.is_set():
            self.leases.wait_for_deadline(longest_s=self.settings.heartbeat_s)
            expired = self.leases.expired(now=time.monotonic())
            if not expired:
                continue
            held = set(self._held()[0])
            for pair in expired:
                if pair in held:
                    self.revoke(
                        pair, reason="lease could not be renewed in time (self-fenced)", self_fenced=True
                    )
                else:
                    self.leases.forget(pair)  # ended meanwhile

    def revoke(self, pair: tuple[int, int], *, reason: str, self_fenced: bool = False) -> None:
        """Stop an attempt this worker may no longer own: kill it if it runs, drop it if buffered.

        A self-fenced one (its lease could not be renewed in time) is recorded `lost` with that
        reason by a later heartbeat, once the database answers (fenced: if another party ended
        the attempt first, the record is discarded).
        """
        silent_s = self.leases.silent_for(pair, now=time.monotonic())
        self.leases.forget(pair)
        with self._buffer_lock:
            dropped = [t for t in self.prefetched if (t.task_instance_id, t.attempt) == pair]
            self.prefetched = collections.deque(
                t for t in self.prefetched if (t.task_instance_id, t.attempt) != pair
            )
        fenced_after_s = silent_s if self_fenced else None
        killed = [
            t
            for t in (slot.revoke(*pair, fenced_after_s=fenced_after_s) for slot in self.slots)
            if t is not None
        ]
        if self_fenced:  # a running one is recorded by its slot, if it did not finish after all
            for task in dropped:
                self._fenced_stop(task, silent_s)
        if killed or dropped:
            log.warning(
                "attempt revoked",
                extra={
                    "event": "worker.attempt_revoked",
                    "task_instance_id": pair[0],
                    "attempt": pair[1],
                    "reason": reason,
                    "was": "running" if killed else "buffered",
                },
            )


def _busy_runs(
    in_slots: Iterable[ClaimedTask],
    buffered: Iterable[ClaimedTask],
    unrecorded: Mapping[tuple[int, int], Any],
) -> frozenset[str]:
    """Runs in which this worker holds an attempt that no outcome of the coming pass ends: still
    active, so the pass need not probe whether they are done (whoever ends their last active
    instance closes them, and the sweep catches a missed close)."""
    return frozenset(
        t.run_id
        for t in itertools.chain(in_slots, buffered)
        if (t.task_instance_id, t.attempt) not in unrecorded
    )


def _is_poke(version: DagVersion, task: ClaimedTask) -> bool:
    """Whether the attempt is a sensor's or a submit-then-poll task's poke."""
    return version.structure.tasks[task.task_id].sensor is not None


def _pair(item: Success | Reschedule) -> tuple[int, int]:
    task = item.task if isinstance(item, Reschedule) else item[0]
    return task.task_instance_id, task.attempt


class BufferSizer:
    """How many attempts a worker buffers ahead by default: what its slots can finish during the
    next BUFFER_HORIZON_PASSES dispatch passes, from moving averages of how long a pass takes
    and of how long each slot spends on one attempt.

    A buffer that covers a pass keeps every slot busy while the pass that refills it runs (with
    no-op tasks on two slots a pass lasts as long as three to five attempts). Sized by what the
    slots could do, not by what they did: a buffer sized by the rate it allowed would stay as
    small as it started. Attempts much longer than a pass get none buffered (their attempts
    stay queued for idle workers), and none before a slot has finished one. Used by the
    dispatch loop's thread only.
    """

    SMOOTHING = 0.3

    def __init__(self) -> None:
        self.pass_s = 0.0

    def observe(self, pass_s: float) -> None:
        """A dispatch pass took `pass_s` seconds."""
        self.pass_s += self.SMOOTHING * (pass_s - self.pass_s)

    def target(self, limit: int, service_s: Sequence[float | None]) -> int:
        """The attempts to hold buffered, from 0 to `limit`, for slots whose average time per
        attempt is `service_s` (None: none finished yet)."""
        known = [s for s in service_s if s is not None and s > 0]
        if not known:
            return 0
        rate = len(service_s) * len(known) / sum(known)  # attempts per second, every slot busy
        wanted = rate * self.pass_s * BUFFER_HORIZON_PASSES
        return min(limit, math.ceil(wanted)) if wanted >= MIN_BUFFERED_SHARE else 0


def _still_hungry(hungry: bool, *, want: int, cycle: Cycle, queues: list[str]) -> bool:
    """Whether the next pass should claim, after a pass that asked for `want` attempts.

    Only a claim that asked and came back short says the queues are empty (it ran after the
    pass's successes, so it saw what they readied). A pass that claimed nothing (the buffer was
    full, or the queues were empty) leaves the answer as it was, unless its successes readied
    work in this worker's queues: then the next pass claims it. Clearing it on such a pass kept
    a busy worker from refilling its buffer until its slots ran dry.
    """
    if want > 0:
        return len(cycle.claimed) >= want
    return hungry or not cycle.readied_queues.isdisjoint(queues)


def _split(items: list[Success | Reschedule]) -> tuple[list[Success], list[Reschedule]]:
    """Held outcomes as (successes, reschedules), each in the order given."""
    pokes = [i for i in items if isinstance(i, Reschedule)]
    return [i for i in items if not isinstance(i, Reschedule)], pokes
