"""Scheduler leadership: one leader at a time by a lease on the database clock (F9, F10, F12).

A scheduler is leader while it holds the `scheduler` lease at its epoch. It renews every third
of the lease; it treats itself as leader only until its own monotonic deadline (renewal sent +
lease - margin), so a paused leader stops acting before a standby may take over. Standbys try
to take the lease a few times a second; the lease lapses on the database clock, never a host's.
A host whose clock differs from the database's by more than `max_skew_s` refuses to lead.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.engine import Connection

from treadle.engine.scheduling import LEADER_LEASE
from treadle.store import leases as lease_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.scheduler")


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
        host_before = time.time()

        def work(conn: Connection) -> tuple[int | None, float]:
            now = db_now(conn)
            # Database minus host clock, the host side read around the database's.
            skew = now.timestamp() - (host_before + time.time()) / 2
            if abs(skew) > self.max_skew_s and self.epoch is None:
                return None, skew
            epoch = lease_store.acquire(
                conn, LEADER_LEASE, holder=self.holder, epoch=self.epoch, lease_s=self.lease_s, now=now
            )
            return epoch, skew

        epoch, self.skew_s = self.db.transact(work)
        if epoch is None:
            if abs(self.skew_s) > self.max_skew_s:
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
