"""The outbox relay: while its scheduler leads, claim due entries, deliver them side by side,
settle them; every database step fenced by the leader's epoch.

At least once: an entry whose relay died mid-delivery is claimed again once its acknowledgement
deadline passed. A relay that lost leadership meanwhile cannot settle what it delivered (the
settle is fenced), so the next leader delivers it again: receivers deduplicate on the id.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from treadle.domain.outbox import DeliveryPolicy, OutboxEntry
from treadle.engine.leadership import Leadership
from treadle.engine.outbox import claim_deliveries, settle_deliveries
from treadle.errors import NotLeader
from treadle.store.database import Database

log = logging.getLogger("treadle.delivery")

#: Entries claimed per round trip; a full batch has the next one claimed while it is posted.
BATCH = 500
#: Deliveries in flight at once.
PARALLEL = 32


class Sink(Protocol):
    """Where entries go: `deliver` returns None on success, else the error in words."""

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Deliver one entry within the acknowledgement deadline."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class Routes:
    """A sink that hands each entry to the sink its `sink` column names ("webhook",
    "openlineage"); an entry for a sink this process lacks fails, named, and ends dead."""

    def __init__(self, sinks: Mapping[str, Sink]) -> None:
        if not sinks:
            raise ValueError("Routes needs at least one sink")
        self.sinks = dict(sinks)

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Deliver through the entry's own sink."""
        sink = self.sinks.get(entry.sink)
        if sink is None:
            return f"no {entry.sink!r} sink is configured here (configured: {', '.join(sorted(self.sinks))})"
        return sink.deliver(entry)

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks.values():
            sink.close()


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
        ordered: Callable[[OutboxEntry], bool] = lambda entry: False,
    ) -> None:
        super().__init__(name="treadle-outbox-relay", daemon=True)
        self.db, self.leadership, self.sink = db, leadership, sink
        #: Entries delivered one after another in claim order (lineage: START before COMPLETE).
        self.ordered = ordered
        self.policy, self.ack_s, self.poll_s = policy, ack_s, poll_s
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="treadle-deliver")
        #: Claims and settles, one at a time and in order, beside the deliveries.
        self.database = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-outbox-db")

    def run(self) -> None:
        """Deliver rounds until stopped; errors back off one poll and never end the thread."""
        while not self.stopping.is_set():
            try:
                self.round()
            except NotLeader:
                pass  # lost the lease mid-round: the next leader claims what was not settled
            except Exception:
                log.exception("outbox relay round failed", extra={"event": "outbox.relay_error"})
            # A round drains what is due; what falls due later (retries, new entries) waits a poll.
            self.stopping.wait(self.poll_s)

    def round(self) -> bool:
        """Claim, deliver and settle until nothing is due; False when nothing was claimed.

        A pipeline: while one batch is posted, the next is claimed, and while that one is
        posted, the previous is settled (one database thread, so claims and settles keep their
        order); the claimed batches never overlap, since a claim holds its entries until their
        acknowledgement deadline.
        """
        epoch = self.leadership.epoch
        if epoch is None or not self.leadership.is_leader():
            return False
        claim = functools.partial(
            claim_deliveries,
            self.db,
            holder=self.leadership.holder,
            epoch=epoch,
            limit=BATCH,
            ack_s=self.ack_s,
        )
        entries = claim()
        if not entries:
            return False
        settling: Future[int] | None = None
        while entries:
            upcoming = self.database.submit(claim) if len(entries) >= BATCH else None
            errors = self._deliver(entries)
            if settling is not None:
                settling.result()
            settling = self.database.submit(self._settle, list(zip(entries, errors, strict=True)), epoch)
            entries = upcoming.result() if upcoming is not None and self.leadership.is_leader() else []
        if settling is not None:
            settling.result()
        return True

    def _deliver(self, entries: list[OutboxEntry]) -> list[str | None]:
        """Deliver a batch: each unordered entry on its own, the ordered ones in one lane, in
        claim order; after a failure in that lane the rest of it is held back (retried later)."""
        lanes: list[list[int]] = []
        in_order: list[int] = []
        for i, entry in enumerate(entries):
            if self.ordered(entry):
                in_order.append(i)
            else:
                lanes.append([i])
        if in_order:
            lanes.append(in_order)
        errors: list[str | None] = [None] * len(entries)

        def run(lane: list[int]) -> None:
            for n, i in enumerate(lane):
                error = self.sink.deliver(entries[i])
                errors[i] = error
                if error is not None:
                    for j in lane[n + 1 :]:
                        errors[j] = f"held back behind entry {entries[i].id}, which failed: {error}"[:2000]
                    return

        list(self.pool.map(run, lanes))
        return errors

    def _settle(self, results: list[tuple[OutboxEntry, str | None]], epoch: int) -> int:
        changed = settle_deliveries(
            self.db, results, holder=self.leadership.holder, epoch=epoch, policy=self.policy
        )
        failed = sum(error is not None for _, error in results)
        if failed:
            log.warning(
                "outbox deliveries failed",
                extra={"event": "outbox.delivery_failed", "failed": failed, "of": len(results)},
            )
        return changed

    def stop(self) -> None:
        """Stop after the round in flight."""
        self.stopping.set()
        self.join(timeout=self.ack_s + 5)
        self.pool.shutdown(wait=False)
        self.database.shutdown(wait=False)
        self.sink.close()
