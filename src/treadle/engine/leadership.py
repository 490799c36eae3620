"""Scheduler leadership: one leader at a time by a lease on the database clock (F9, F10, F12).

A scheduler is leader while it holds the `scheduler` lease at its epoch. It renews every third
of the lease; it treats itself as leader only until its own monotonic deadline (renewal sent +
lease - margin), so a paused leader stops acting before a standby may take over. Standbys try
to take the lease a few times a second; the lease lapses on the database clock, never a host's.
A host whose clock differs from the database's by more than `max_skew_s` refuses to lead; the
skew is judged only from database reads whose round trip is short enough to bound it
(domain/clock.py), so a stalled database never makes a host refuse leadership.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from sqlalchemy.engine import Connection

from treadle.domain.clock import SkewJudgement, SkewSample, SkewVerdict, judge_skew, max_round_trip_s
from treadle.engine.scheduling import LEADER_LEASE
from treadle.store import leases as lease_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.scheduler")

#: Readings of the database clock per refresh at most, while each round trip is too long to judge.
SKEW_SAMPLES = 3


class Leadership:
    """This process's claim on the leader lease."""

    def __init__(self, db: Database, *, holder: str, lease_s: float, max_skew_s: float = 2.0) -> None:
        self.db = db
        self.holder = holder
        self.lease_s = lease_s
        self.max_skew_s = max_skew_s
        #: Epoch held, or None while standing by.
        self.epoch: int | None = None
        #: Monotonic time after which this process must not act as leader without a renewal.
        self.valid_until = 0.0
        #: Last measured database-minus-host clock difference, seconds.
        self.skew_s = 0.0
        #: Last verdict from a measurable round trip; kept while the skew cannot be measured.
        self.skew_too_large = False
        #: Monotonic time of the last refresh the database answered (leading or standing by).
        self.seen_at: float | None = None

    @property
    def renew_every_s(self) -> float:
        """Seconds between renewals while leading."""
        return self.lease_s / 3

    def is_leader(self) -> bool:
        """True while the lease is held and this process's own deadline has not passed."""
        return self.epoch is not None and time.monotonic() < self.valid_until

    def refresh(self) -> bool:
        """Renew the lease if held, else try to take it; returns whether this process leads."""
        sent = time.monotonic()

        def work(conn: Connection) -> tuple[int | None, SkewJudgement, bool]:
            samples, now = _read_clock(conn, max_skew_s=self.max_skew_s)
            judgement = judge_skew(samples, max_skew_s=self.max_skew_s)
            too_large = self.skew_too_large
            if judgement.verdict is not SkewVerdict.UNKNOWN:
                too_large = judgement.verdict is SkewVerdict.TOO_LARGE
            if too_large and self.epoch is None:
                return None, judgement, too_large
            epoch = lease_store.acquire(
                conn, LEADER_LEASE, holder=self.holder, epoch=self.epoch, lease_s=self.lease_s, now=now
            )
            return epoch, judgement, too_large

        epoch, judgement, self.skew_too_large = self.db.transact(work)
        self.seen_at = time.monotonic()
        self._log_skew(judgement)
        if epoch is None:
            if self.skew_too_large:
                log.error(
                    "clock skew too large to lead",
                    extra={
                        "event": "scheduler.skew",
                        "skew_s": round(self.skew_s, 3),
                        "max_s": self.max_skew_s,
                    },
                )
            if self.epoch is not None:
                log.warning("leadership lost", extra={"event": "scheduler.leader_lost", "epoch": self.epoch})
            self.epoch = None
            return False
        if epoch != self.epoch:
            log.info(
                "leadership acquired",
                extra={"event": "scheduler.leader_acquired", "epoch": epoch, "holder": self.holder},
            )
        self.epoch = epoch
        # Act as leader until the lease would lapse, less a margin for this process's pauses.
        self.valid_until = sent + self.lease_s * 0.8
        return True

    def _log_skew(self, judgement: SkewJudgement) -> None:
        if judgement.skew_s is not None:
            self.skew_s = judgement.skew_s
            return
        rtt = judgement.best_round_trip_s
        log.warning(
            "clock skew could not be measured: every database round trip was too long; "
            "keeping the previous verdict",
            extra={
                "event": "scheduler.skew_unmeasured",
                "round_trip_s": None if rtt is None else round(rtt, 3),
                "max_round_trip_s": max_round_trip_s(self.max_skew_s),
                "skew_too_large": self.skew_too_large,
            },
        )

    def step_down(self, reason: str) -> None:
        """Stop acting as leader (the lease lapses or was already taken)."""
        if self.epoch is not None:
            log.warning("stepping down", extra={"event": "scheduler.step_down", "reason": reason})
        self.epoch = None

    def resign(self) -> None:
        """Give the lease up at once so a standby takes over without waiting for it to lapse."""
        epoch = self.epoch
        self.epoch = None
        if epoch is None:
            return

        def work(conn: Connection) -> bool:
            return lease_store.release(conn, LEADER_LEASE, holder=self.holder, epoch=epoch, now=db_now(conn))

        try:
            if self.db.transact(work, attempts=2):
                log.info("leadership released", extra={"event": "scheduler.leader_released", "epoch": epoch})
        except Exception:
            log.warning("could not release the leader lease; it will lapse", exc_info=True)


def _read_clock(conn: Connection, *, max_skew_s: float) -> tuple[list[SkewSample], datetime]:
    """Read the database clock, again while the round trip is too long to judge skew (at most
    SKEW_SAMPLES times); return the readings and the last database time.

    Each reading is bracketed by host reads of its own: the first one may include a wait for a
    connection or a lock, and a transaction retried after an outage is measured afresh.
    """
    samples: list[SkewSample] = []
    while True:
        before = time.time()
        now = db_now(conn)
        samples.append(SkewSample(host_before_s=before, db_s=now.timestamp(), host_after_s=time.time()))
        judged = judge_skew(samples, max_skew_s=max_skew_s).verdict is not SkewVerdict.UNKNOWN
        if judged or len(samples) >= SKEW_SAMPLES:
            return samples, now
