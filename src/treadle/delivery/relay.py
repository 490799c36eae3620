"""The outbox relay: while its scheduler leads, claim due entries, deliver them side by side,
settle them; every database step fenced by the leader's epoch.

At least once: an entry whose relay died mid-delivery is claimed again once its acknowledgement
deadline passed. A relay that lost leadership meanwhile cannot settle what it delivered (the
settle is fenced), so the next leader delivers it again: receivers deduplicate on the id.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from treadle.domain.outbox import DeliveryPolicy, OutboxEntry
from treadle.engine.leadership import Leadership
from treadle.engine.outbox import claim_deliveries, settle_deliveries
from treadle.errors import NotLeader
from treadle.store.database import Database

log = logging.getLogger("treadle.delivery")

#: Entries claimed per round trip; a full batch is followed by another at once.
BATCH = 200
#: Deliveries in flight at once.
PARALLEL = 16


class Sink(Protocol):
    """Where entries go: `deliver` returns None on success, else the error in words."""

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Deliver one entry within the acknowledgement deadline."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class OutboxRelay(threading.Thread):
    """Delivers the outbox while `leadership` leads; idle (polling `poll_s`) otherwise."""

    def __init__(
        self,
        db: Database,
        leadership: Leadership,
        sink: Sink,
        *,
        policy: DeliveryPolicy,
        ack_s: float,
        poll_s: float = 1.0,
    ) -> None:
        super().__init__(name="treadle-outbox-relay", daemon=True)
        self.db, self.leadership, self.sink = db, leadership, sink
        self.policy, self.ack_s, self.poll_s = policy, ack_s, poll_s
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="treadle-deliver")

    def run(self) -> None:
        """Deliver rounds until stopped; errors back off one poll and never end the thread."""
        while not self.stopping.is_set():
            try:
                full = self.round()
            except NotLeader:
                full = False
            except Exception:
                log.exception("outbox relay round failed", extra={"event": "outbox.relay_error"})
                full = False
            if not full:
                self.stopping.wait(self.poll_s)

    def round(self) -> bool:
        """One claim, deliver, settle round; True when it claimed a full batch (more may be due)."""
        epoch = self.leadership.epoch
        if epoch is None or not self.leadership.is_leader():
            return False
        holder = self.leadership.holder
        entries = claim_deliveries(self.db, holder=holder, epoch=epoch, limit=BATCH, ack_s=self.ack_s)
        if not entries:
            return False
        errors = list(self.pool.map(self.sink.deliver, entries))
        results = list(zip(entries, errors, strict=True))
        settle_deliveries(self.db, results, holder=holder, epoch=epoch, policy=self.policy)
        failed = sum(e is not None for e in errors)
        if failed:
            log.warning(
                "outbox deliveries failed",
                extra={"event": "outbox.delivery_failed", "failed": failed, "of": len(entries)},
            )
        return len(entries) >= BATCH

    def stop(self) -> None:
        """Stop after the round in flight."""
        self.stopping.set()
        self.join(timeout=self.ack_s + 5)
        self.pool.shutdown(wait=False)
        self.sink.close()
