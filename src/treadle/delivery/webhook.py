"""The webhook sink: one HTTPS POST per entry, its body signed with HMAC-SHA256.

Headers: `X-Treadle-Event` (the kind), `X-Treadle-Delivery` (the entry id: receivers deduplicate
on it, since delivery is at least once), `X-Treadle-Timestamp` (Unix seconds) and
`X-Treadle-Signature: sha256=<hex>` over `<timestamp>.<body>` with TREADLE_OUTBOX_WEBHOOK_SECRET.
Any 2xx within the acknowledgement deadline is a delivery; anything else a failure.

The relay posts from many threads at once; each thread keeps its own HTTP/1.1 connection alive
(delivery/http.py, which the Slack and OpenLineage sinks post with too).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

from treadle.delivery.http import KeepAlivePoster
from treadle.domain.outbox import OutboxEntry

#: The sink name entries for this sink carry.
SINK = "webhook"


def signature(secret: str, *, timestamp: str, body: bytes) -> str:
    """The `X-Treadle-Signature` value of `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def body_of(entry: OutboxEntry) -> bytes:
    """The JSON document a receiver gets."""
    document = {
        "id": entry.id,
        "kind": entry.kind,
        "created_at": entry.created_at.isoformat(),
        "attempt": entry.attempts + 1,
        "payload": entry.payload,
    }
    return json.dumps(document, separators=(",", ":"), default=str).encode()


class WebhookSink:
    """Posts entries to `url` over kept-alive connections, one per posting thread (safe to share
    between threads)."""

    def __init__(self, url: str, *, secret: str | None, ack_s: float) -> None:
        self.poster = KeepAlivePoster(url, ack_s=ack_s, name="webhook")
        self.url, self.secret, self.ack_s = url, secret, ack_s

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Post one entry; None when the receiver acknowledged it, else what went wrong."""
        body = body_of(entry)
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Treadle-Event": entry.kind,
            "X-Treadle-Delivery": str(entry.id),
            "X-Treadle-Timestamp": timestamp,
        }
        if self.secret:
            headers["X-Treadle-Signature"] = signature(self.secret, timestamp=timestamp, body=body)
        return self.poster.post(body, headers)

    def close(self) -> None:
        """Close the kept-alive connections."""
        self.poster.close()
