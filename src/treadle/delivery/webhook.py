"""The webhook sink: one HTTPS POST per entry, its body signed with HMAC-SHA256.

Headers: `X-Treadle-Event` (the kind), `X-Treadle-Delivery` (the entry id: receivers deduplicate
on it, since delivery is at least once), `X-Treadle-Timestamp` (Unix seconds) and
`X-Treadle-Signature: sha256=<hex>` over `<timestamp>.<body>` with TREADLE_OUTBOX_WEBHOOK_SECRET.
Any 2xx within the acknowledgement deadline is a delivery; anything else a failure.

The relay posts from many threads at once; each thread keeps its own HTTP/1.1 connection alive
(the standard library's http.client: an httpx client shared by 32 threads cost about 2.8 ms of
CPU per post on the benchmark machine, this about 0.35 ms, see docs/performance.md).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import ssl
import threading
import time
from urllib.parse import urlsplit

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
    """Posts entries to `url` over kept-alive connections, one per posting thread (safe to share
    between threads)."""

    def __init__(self, url: str, *, secret: str | None, ack_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook URL must be http:// or https:// with a host, got {url!r}")
        self.url, self.secret, self.ack_s = url, secret, ack_s
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._host_header = parts.netloc.rpartition("@")[2]
        self._tls = ssl.create_default_context() if self._https else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before (it may have been closed)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.ack_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.ack_s)
        self._local.conn = conn
        with self._lock:
            self._connections.append(conn)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Post one entry; None when the receiver acknowledged it, else what went wrong."""
        body = body_of(entry)
        timestamp = str(int(time.time()))
        headers = {
            "Host": self._host_header,
            "Content-Type": "application/json",
            "X-Treadle-Event": entry.kind,
            "X-Treadle-Delivery": str(entry.id),
            "X-Treadle-Timestamp": timestamp,
        }
        if self.secret:
            headers["X-Treadle-Signature"] = signature(self.secret, timestamp=timestamp, body=body)
        while True:
            conn, reused = self._connection()
            try:
                conn.request("POST", self._target, body=body, headers=headers)
                response = conn.getresponse()
                text = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop(conn)
                if reused:
                    continue  # the receiver closed an idle kept-alive connection: once more, on a new one
                return f"{type(exc).__name__}: {exc}"[:2000]
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                return f"{type(exc).__name__}: {exc}"[:2000]
            if response.will_close:
                self._drop(conn)
            if 200 <= response.status < 300:
                return None
            return f"HTTP {response.status}: {text[:500].decode('utf-8', 'replace')}"

    def close(self) -> None:
        """Close the kept-alive connections."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
