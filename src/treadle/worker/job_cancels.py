"""Cancels of submitted external jobs that a worker owes (a cancelled or abandoned
submit-then-poll task): run in a task process of their own, since `cancel(handle)` is user code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from treadle.domain.dag_version import DagVersion
from treadle.engine.sensing import claim_job_cancels, finish_job_cancel
from treadle.store.database import Database
from treadle.store.job_cancellations import JobCancellation
from treadle.worker.child_process import ChildImports, ChildProcess
from treadle.worker.protocol import receive, send

log = logging.getLogger("treadle.worker")

#: Longest a job's `cancel(handle)` may take before its process is replaced (seconds).
CANCEL_LIMIT_S = 60.0


class JobCanceller(threading.Thread):
    """Takes owed job cancels of the worker's queues and runs each task's `cancel(handle)`."""

    def __init__(
        self,
        *,
        db: Database,
        worker_id: str,
        queues: list[str],
        imports: ChildImports,
        version: Callable[[int], DagVersion],
        poll_s: float,
        lease_s: float,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="treadle-job-cancels", daemon=True)
        self.db, self.worker_id, self.queues = db, worker_id, queues
        self.imports, self.version = imports, version
        self.poll_s, self.lease_s = poll_s, lease_s
        self.stop = stop
        #: Set by a cancellation's wake-up: look now rather than at the next poll.
        self.wake = threading.Event()
        self.child: ChildProcess | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    done = self.pass_once()
                except Exception as exc:
                    log.warning(
                        "job cancels not taken; trying again",
                        extra={"event": "job.cancels_failed", "error": str(exc)[:300]},
                    )
                    done = 0
                if not done:
                    self.wake.wait(self.poll_s)
                    self.wake.clear()
        finally:
            if self.child is not None:
                self.child.kill()

    def pass_once(self) -> int:
        """Run the owed cancels due now; returns how many were taken."""
        jobs = claim_job_cancels(self.db, worker_id=self.worker_id, queues=self.queues, lease_s=self.lease_s)
        for job in jobs:
            error = self._cancel(job)
            finish_job_cancel(self.db, job, worker_id=self.worker_id, error=error)
            log.info(
                "job cancelled" if error is None else "job cancel failed",
                extra={
                    "event": "job.cancelled" if error is None else "job.cancel_failed",
                    "task_instance_id": job.task_instance_id,
                    "run_id": job.run_id,
                    "task_id": job.task_id,
                    "error": error,
                },
            )
        return len(jobs)

    def _cancel(self, job: JobCancellation) -> str | None:
        """Run the job's `cancel(handle)` in a task process: None, or what went wrong."""
        try:
            version = self.version(job.dag_version_id)
        except Exception as exc:
            return f"DAG version {job.dag_version_id} unreadable: {exc}"
        if self.child is None:
            self.child = ChildProcess(self.imports)
        elif not self.child.process.is_alive():
            self.child.restart()
        child = self.child
        assert child.conn is not None
        try:
            send(
                child.conn,
                {
                    "kind": "cancel_job",
                    "dag_id": job.dag_id,
                    "task_id": job.task_id,
                    "version_hash": version.version_hash,
                    "fileloc": version.structure.fileloc,
                    "handle": job.handle,
                },
            )
            if not child.conn.poll(CANCEL_LIMIT_S):
                child.restart()
                return f"cancel(handle) did not return within {CANCEL_LIMIT_S} s"
            reply = receive(child.conn)
        except (EOFError, OSError):
            description = child.exit_description()
            child.restart()
            return f"the process running cancel(handle) ended: {description}"
        return None if reply.get("ok") else str(reply.get("error") or "cancel(handle) failed")
