"""Writes the successes of a worker's slots together: one transaction for whatever is waiting.

A slot hands over its attempt's result and blocks until the outcome is committed, exactly as if
it had written it itself, so a slot is free (and claimable capacity) only once its result is
recorded. While one transaction is in flight the next successes queue up and go in the next
one: a lone completion is written at once, a burst shares its round trips.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

from treadle.domain.records import ClaimedTask
from treadle.engine.datasets import OutletEvent
from treadle.engine.execution import Ending, complete_attempt, complete_attempts
from treadle.store.database import Database

log = logging.getLogger("treadle.worker")

#: Most successes written in one transaction (bounds the statement sizes).
MAX_BATCH = 64


class _Pending:
    """One success waiting to be written, and the slot waiting for its outcome."""

    __slots__ = ("done", "ending", "error", "outlet_events", "task", "value")

    def __init__(self, task: ClaimedTask, value: Any, outlet_events: Mapping[str, OutletEvent]) -> None:
        self.task, self.value = task, value  # Any: the task's JSON result
        self.outlet_events = outlet_events
        self.done = threading.Event()
        self.ending: Ending | None = None
        self.error: BaseException | None = None


class Completer(threading.Thread):
    """Batches slots' successes into shared transactions (see the module docstring)."""

    def __init__(self, db: Database, *, worker_id: str, hostname: str) -> None:
        super().__init__(name="treadle-completer", daemon=True)
        self.db, self.worker_id, self.hostname = db, worker_id, hostname
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()

    def complete(
        self, task: ClaimedTask, value: Any, outlet_events: Mapping[str, OutletEvent] | None = None
    ) -> Ending:
        """Record a success (with its outlet annotations) and return how it was taken; raises what
        writing it raised."""
        pending = _Pending(task, value, outlet_events or {})
        self._queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.ending is not None
        return pending.ending

    def run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write(batch)

    def _write(self, batch: list[_Pending]) -> None:
        try:
            endings = complete_attempts(
                self.db,
                [(p.task, p.value, p.outlet_events) for p in batch],
                worker_id=self.worker_id,
                hostname=self.hostname,
            )
        except Exception as exc:
            if len(batch) == 1:
                self._fail(batch[0], exc)
                return
            # One bad item must not sink its neighbours: write each on its own.
            log.exception("batched completion failed", extra={"event": "worker.complete_batch_error"})
            for p in batch:
                try:
                    self._finish(
                        p,
                        complete_attempt(
                            self.db,
                            p.task,
                            worker_id=self.worker_id,
                            hostname=self.hostname,
                            value=p.value,
                            outlet_events=p.outlet_events,
                        ),
                    )
                except Exception as one:
                    self._fail(p, one)
            return
        for p, ending in zip(batch, endings, strict=True):
            self._finish(p, ending)

    @staticmethod
    def _finish(pending: _Pending, ending: Ending) -> None:
        pending.ending = ending
        pending.done.set()

    @staticmethod
    def _fail(pending: _Pending, error: BaseException) -> None:
        pending.error = error
        pending.done.set()
