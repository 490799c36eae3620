"""Self-fencing: when may a worker no longer trust that it still owns an attempt?

A lease renewed by a statement sent at monotonic time T expires in the database no earlier than
T + lease (the database stamps it after receiving it). The worker must kill the attempt before
that, with a margin of one heartbeat interval, whether or not the call that would renew it ever
returns. This module keeps, per held attempt, the send time of the newest claim or renewal that
succeeded; the watchdog asks it which attempts are past their own deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from treadle.domain.task_records import ClaimedTask

#: An attempt: (task instance id, attempt number).
Pair = tuple[int, int]


class LeaseClock:
    """Send times of the last successful claim or renewal of each held attempt (thread-safe)."""

    def __init__(self, *, lease_s: float, margin_s: float) -> None:
        #: How long after a send the worker still trusts it owns the attempt.
        self.trust_s = max(lease_s - margin_s, 0.0)
        self._sent: dict[Pair, float] = {}
        self._lock = threading.Lock()
        #: Set by a grant whose deadline falls before the watchdog's planned wake-up.
        self._granted = threading.Event()
        #: When the sleeping watchdog plans to wake (monotonic).
        self._wake_at = float("inf")

    def granted(self, pairs: Iterable[Pair], *, sent_at: float) -> None:
        """Record that a claim or renewal sent at `sent_at` succeeded for `pairs`."""
        with self._lock:
            for pair in pairs:
                if self._sent.get(pair, float("-inf")) < sent_at:
                    self._sent[pair] = sent_at
            # A claim sent before a renewal that returned first can fall due before the deadline
            # the watchdog sleeps towards; anything later it finds when it wakes.
            if sent_at + self.trust_s < self._wake_at:
                self._granted.set()

    def earliest_deadline(self) -> float | None:
        """The earliest monotonic time after which a held attempt is no longer trusted."""
        with self._lock:
            sent = min(self._sent.values(), default=None)
        return None if sent is None else sent + self.trust_s

    def wait_for_deadline(self, *, longest_s: float) -> None:
        """Sleep until just past the earliest deadline, `longest_s`, or a grant that falls due
        before then, whichever is first (the watchdog: one thread at a time)."""
        with self._lock:
            self._granted.clear()
            sent = min(self._sent.values(), default=None)
            now = time.monotonic()
            wait = longest_s
            if sent is not None:
                # Just past it: `expired` counts an attempt once `now - sent > trust_s`.
                wait = min(max(sent + self.trust_s - now, 0.0) + 0.001, longest_s)
            self._wake_at = now + wait
        self._granted.wait(wait)

    def forget(self, pair: Pair) -> None:
        """The attempt ended or was revoked: nothing to guard any more."""
        with self._lock:
            self._sent.pop(pair, None)

    def expired(self, *, now: float) -> list[Pair]:
        """Attempts whose last successful send is older than the trust window at `now`."""
        with self._lock:
            return sorted(p for p, sent in self._sent.items() if now - sent > self.trust_s)

    def silent_for(self, pair: Pair, *, now: float) -> float:
        """Seconds since the last successful send for `pair` (0 if not held)."""
        with self._lock:
            sent = self._sent.get(pair)
        return 0.0 if sent is None else now - sent

    def deadline(self, pair: Pair) -> float | None:
        """The monotonic time after which `pair` is no longer trusted (None: not held)."""
        with self._lock:
            sent = self._sent.get(pair)
        return None if sent is None else sent + self.trust_s


class FencedAttempts:
    """Attempts this worker stopped because it could not renew their leases in time, waiting to
    be recorded `lost` with that reason once the database answers again (thread-safe)."""

    def __init__(self) -> None:
        self._pending: dict[Pair, tuple[ClaimedTask, float]] = {}
        self._lock = threading.Lock()

    def add(self, task: ClaimedTask, *, silent_s: float) -> None:
        """`task` was stopped after `silent_s` seconds without a successful renewal."""
        with self._lock:
            self._pending[(task.task_instance_id, task.attempt)] = (task, silent_s)

    def pending(self) -> list[tuple[ClaimedTask, float]]:
        """What is still to be recorded."""
        with self._lock:
            return list(self._pending.values())

    def done(self, task: ClaimedTask) -> None:
        """`task`'s stop was recorded (or another party had ended the attempt)."""
        with self._lock:
            self._pending.pop((task.task_instance_id, task.attempt), None)
