"""The webhook sink: one HTTPS POST per entry, its body signed with HMAC-SHA256.

Headers: `X-Treadle-Event` (the kind), `X-Treadle-Delivery` (the entry id: receivers deduplicate
on it, since delivery is at least once), `X-Treadle-Timestamp` (Unix seconds) and
`X-Treadle-Signature: sha256=<hex>` over `<timestamp>.<body>` with TREADLE_OUTBOX_WEBHOOK_SECRET.
Any 2xx within the acknowledgement deadline is a delivery; anything else a failure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx

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


def post(client: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> str | None:
    """POST `body`; None when the receiver took it (any 2xx), else what went wrong."""
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:2000]
    if 200 <= response.status_code < 300:
        return None
    return f"HTTP {response.status_code}: {response.text[:500]}"


class WebhookSink:
    """Posts entries to `url` (connections kept alive; safe to share between threads)."""

    def __init__(self, url: str, *, secret: str | None, ack_s: float) -> None:
        self.url, self.secret = url, secret
        self.client = httpx.Client(timeout=ack_s, limits=httpx.Limits(max_connections=64))

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
        return post(self.client, self.url, body, headers)

    def close(self) -> None:
        """Close the kept-alive connections."""
        self.client.close()
