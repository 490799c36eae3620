"""The worker process: a claim loop bounded by free slots, a heartbeat thread, DAG refresh."""

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

from treadle.authoring.loader import folder_signature, load_folder
from treadle.config import Settings
from treadle.domain.dag_version import DagVersion
from treadle.domain.records import ClaimedTask
from treadle.engine.dags import SyncReport, sync_dags, version_of
from treadle.engine.execution import claim_task_instances, extend_leases, hand_back_attempts
from treadle.engine.workers import record_worker, touch_worker
from treadle.store.database import Database
from treadle.store.dialects import CANCEL_CHANNEL, READY_CHANNEL
from treadle.store.notifications import listen
from treadle.worker.completer import Completer
from treadle.worker.slot import Slot

log = logging.getLogger("treadle.worker")


def sync_dag_folder(db: Database, folder: Path) -> SyncReport:
    """Import the DAG folder and register what it holds (structures and per-file errors)."""
    loaded = load_folder(folder)
    return sync_dags(
        db,
        structures=[d.structure() for d in loaded.dags.values()],
        scanned_files=loaded.files,
        errors={f: (e.message, e.traceback) for f, e in loaded.errors.items()},
        folder=str(folder),
    )


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
        #: Attempts claimed ahead of a free slot (they hold a lease and are heartbeated).
        self.prefetch = prefetch
        self.prefetched: collections.deque[ClaimedTask] = collections.deque()
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
        self._last_renewal = time.monotonic()

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
                folder=self.settings.dags_folder,
                max_result_bytes=self.settings.max_result_bytes,
                version=self.version,
                on_idle=self._slot_idle,
                complete=completer.complete,
            )
            self.slots.append(slot)
            slot.start()
        threading.Thread(target=self._heartbeat_loop, name="treadle-heartbeat", daemon=True).start()
        if self.db.dialect == "postgresql":
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
        report = sync_dag_folder(self.db, self.settings.dags_folder)
        self._signature = signature
        log.info(
            "dags synced",
            extra={"event": "dags.synced", "dags": report.dags, "errors": report.errors},
        )
        return True

    def run(self) -> None:
        """Claim and dispatch until stopped (call start() first)."""
        next_refresh = time.monotonic() + self.settings.dag_refresh_s
        while not self.stopping.is_set():
            self._dispatch_prefetched()
            # Bounded admission: never more than `concurrency` running plus `prefetch` waiting.
            want = self.idle.qsize() + self.prefetch - len(self.prefetched)
            claimed = []
            if want > 0:
                try:
                    claimed = claim_task_instances(
                        self.db,
                        worker_id=self.worker_id,
                        hostname=self.hostname,
                        queues=self.queues,
                        limit=want,
                        lease_s=self.settings.lease_s,
                    )
                except Exception:
                    log.exception("claim failed", extra={"event": "worker.claim_error"})
                    self.stopping.wait(1.0)
            self.prefetched.extend(claimed)
            self._dispatch_prefetched()
            if time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + self.settings.dag_refresh_s
                self._refresh_quietly()
            if not claimed or len(claimed) < want:
                self.wake.wait(self.poll_s)
                self.wake.clear()

    def _dispatch_prefetched(self) -> None:
        # Only this thread takes idle slots, so a non-empty queue cannot empty under us.
        while self.prefetched and not self.idle.empty():
            self.idle.get().assign(self.prefetched.popleft())

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
        log.info(
            "worker stopped",
            extra={"event": "worker.stopped", "worker_id": self.worker_id, "handed_back": handed},
        )
        return handed

    def _slot_idle(self, slot: Slot) -> None:
        self.idle.put(slot)
        self.wake.set()

    def _refresh_quietly(self) -> None:
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

    def _heartbeat_once(self) -> None:
        current = [s.running for s in self.slots]
        held = [(r.task.task_instance_id, r.task.attempt) for r in current if r is not None]
        waiting = list(self.prefetched)
        held.extend((t.task_instance_id, t.attempt) for t in waiting)
        try:
            renewed = extend_leases(
                self.db, worker_id=self.worker_id, held=held, lease_s=self.settings.lease_s
            )
            touch_worker(
                self.db,
                self.worker_id,
                state="stopping" if self.stopping.is_set() else "running",
                active=len(held) - len(waiting),
                prefetched=len(waiting),
            )
        except Exception:
            log.exception("heartbeat failed", extra={"event": "worker.heartbeat_error"})
            # Self-fence (F2): past our own monotonic deadline we can no longer be sure we own
            # any attempt, so we stop them rather than risk running twice.
            margin = self.settings.heartbeat_s
            if time.monotonic() - self._last_renewal > self.settings.lease_s - margin:
                for pair in held:
                    for slot in self.slots:
                        slot.revoke(*pair)
            return
        self._last_renewal = time.monotonic()
        for pair in set(held) - renewed:
            for slot in self.slots:
                slot.revoke(*pair)
