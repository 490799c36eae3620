"""The worker process: a claim loop bounded by free slots, a heartbeat thread, a self-fencing
watchdog, DAG refresh."""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
import uuid
from pathlib import Path

from treadle.authoring.loader import folder_signature
from treadle.config import Settings
from treadle.domain.dag_version import DagVersion
from treadle.domain.records import AttemptError, ClaimedTask
from treadle.domain.states import AttemptOutcome
from treadle.engine.dags import SyncReport, sync_dags, version_of
from treadle.engine.execution import (
    claim_task_instances,
    extend_leases,
    fail_attempt,
    hand_back_attempts,
    start_claimed,
)
from treadle.engine.workers import record_worker, touch_worker
from treadle.store.database import Database
from treadle.store.dialects import CANCEL_CHANNEL, READY_CHANNEL
from treadle.store.notifications import listen
from treadle.worker.child_process import ChildImports
from treadle.worker.completer import Completer
from treadle.worker.dag_processor import ParsedFolder, parse_folder
from treadle.worker.fencing import FencedAttempts, LeaseClock
from treadle.worker.slot import Slot

log = logging.getLogger("treadle.worker")


def sync_dag_folder(db: Database, folder: Path, *, file_limit_s: float) -> tuple[SyncReport, ParsedFolder]:
    """Import the DAG folder in a processor process (each file within `file_limit_s`) and register
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
    ) -> None:
        self.db, self.settings = db, settings
        self.concurrency, self.queues, self.poll_s = concurrency, queues, poll_s
        #: Attempts claimed ahead of a free slot (they hold a lease and are heartbeated, but are
        #: started only when a slot takes them). Guarded by `_buffer_lock`.
        self.prefetch = prefetch
        self.prefetched: collections.deque[ClaimedTask] = collections.deque()
        self._buffer_lock = threading.Lock()
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

    def version(self, version_id: int) -> DagVersion:
        """Return a DAG version (cached)."""
        cached = self.db.version_cache.get(version_id)
        if cached is not None:
            return cached
        return self.db.query(lambda conn: version_of(self.db, conn, version_id))

    def start(self) -> None:
        """Register DAGs and this worker, spawn the slots, start the helper threads."""
        self.refresh_dags()
        record_worker(
            self.db,
            worker_id=self.worker_id,
            hostname=self.hostname,
            pid=os.getpid(),
            queues=self.queues,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
        )
        completer = Completer(self.db, worker_id=self.worker_id, hostname=self.hostname)
        completer.start()
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
                complete=completer.complete,
            )
            self.slots.append(slot)
            slot.start()
        threading.Thread(target=self._heartbeat_loop, name="treadle-heartbeat", daemon=True).start()
        threading.Thread(target=self._watchdog_loop, name="treadle-watchdog", daemon=True).start()
        threading.Thread(target=self._refresh_loop, name="treadle-dag-refresh", daemon=True).start()
        if self.db.supports_wakeups:
            handlers = {READY_CHANNEL: self.wake.set, CANCEL_CHANNEL: self.beat_now.set}
            threading.Thread(
                target=listen,
                name="treadle-listen",
                daemon=True,
                kwargs={"url": self.db.url, "handlers": handlers, "stop": self.closed},
            ).start()
        log.info(
            "worker started",
            extra={
                "event": "worker.started",
                "worker_id": self.worker_id,
                "concurrency": self.concurrency,
                "queues": self.queues,
            },
        )

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
        """Claim and dispatch until stopped (call start() first)."""
        while not self.stopping.is_set():
            self._dispatch_prefetched()
            claimed = []
            # Bounded admission: never more than `concurrency` running plus `prefetch` waiting.
            idle = self.idle.qsize()
            want = idle + self.prefetch - len(self.prefetched)
            if want > 0:
                claimed = self._claim(limit=want, start=idle)
            for task in claimed:
                if task.started_at is not None:  # started by the claim: at most `idle` of them
                    self.idle.get().assign(task)
                else:
                    with self._buffer_lock:
                        self.prefetched.append(task)
            self._dispatch_prefetched()
            if not claimed or len(claimed) < want:
                self.wake.wait(self.poll_s)
                self.wake.clear()

    def _claim(self, *, limit: int, start: int) -> list[ClaimedTask]:
        sent = time.monotonic()
        try:
            claimed = claim_task_instances(
                self.db,
                worker_id=self.worker_id,
                hostname=self.hostname,
                queues=self.queues,
                limit=limit,
                start=start,
                lease_s=self.settings.lease_s,
            )
        except Exception:
            log.exception("claim failed", extra={"event": "worker.claim_error"})
            self.stopping.wait(1.0)
            return []
        self.leases.granted(((t.task_instance_id, t.attempt) for t in claimed), sent_at=sent)
        return claimed

    def _dispatch_prefetched(self) -> None:
        """Start buffered attempts in idle slots; the start re-checks ownership in the database,
        so one that was cancelled, reaped or lost while it waited never runs."""
        # Only this thread takes idle slots, so a non-empty queue cannot empty under us.
        while not self.idle.empty():
            with self._buffer_lock:
                if not self.prefetched:
                    return
                task = self.prefetched.popleft()
            try:
                started = start_claimed(self.db, task, worker_id=self.worker_id)
            except Exception:
                log.exception("could not start a buffered attempt", extra={"event": "worker.start_error"})
                with self._buffer_lock:
                    self.prefetched.appendleft(task)
                return
            if started is None:
                self.leases.forget((task.task_instance_id, task.attempt))
                log.info(
                    "buffered attempt no longer held; not started",
                    extra={
                        "event": "worker.buffered_dropped",
                        "task_instance_id": task.task_instance_id,
                        "attempt": task.attempt,
                    },
                )
                continue
            self.idle.get().assign(started)

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

    def _slot_idle(self, slot: Slot) -> None:
        self.idle.put(slot)
        self.wake.set()

    def _refresh_loop(self) -> None:
        """Re-register edited DAG files, in a thread of its own: the claim loop never waits on an
        import (each runs in a processor process, within its time limit)."""
        while not self.stopping.wait(self.settings.dag_refresh_s):
            try:
                self.refresh_dags()
            except Exception:
                log.exception("dag refresh failed", extra={"event": "dags.sync_error"})

    def _heartbeat_loop(self) -> None:
        while not self.closed.is_set():
            self.beat_now.wait(self.settings.heartbeat_s)
            self.beat_now.clear()
            if not self.closed.is_set():
                self._heartbeat_once()

    def _held(self) -> tuple[list[tuple[int, int]], int]:
        """The attempts this worker holds (running, then buffered) and how many are buffered."""
        held = [(r.task.task_instance_id, r.task.attempt) for r in (s.running for s in self.slots) if r]
        with self._buffer_lock:
            waiting = [(t.task_instance_id, t.attempt) for t in self.prefetched]
        return held + waiting, len(waiting)

    def _heartbeat_once(self) -> None:
        held, waiting = self._held()
        sent = time.monotonic()
        try:
            renewed = extend_leases(
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
                self.revoke(pair, reason="lease no longer held")
            self._record_fenced()
        held_outcomes = sum(slot.holding_outcome for slot in self.slots)
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
                state="stopping" if self.stopping.is_set() else "running",
                active=len(held) - waiting,
                prefetched=waiting,
            )
        except Exception:
            log.exception("heartbeat failed", extra={"event": "worker.heartbeat_error"})

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
