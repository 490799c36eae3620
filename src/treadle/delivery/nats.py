"""The NATS sink: each entry published on a subject under TREADLE_OUTBOX_NATS_SUBJECT_PREFIX,
with nats-py (the `nats` extra).

Subjects: `<prefix>.dataset.<dataset name>` for "dataset version published" (the name's dots
are subject tokens, so `<prefix>.dataset.warehouse.>` follows every dataset under
`warehouse.`), `<prefix>.alert.<kind>.<dag id>` for alerts. The body is the webhook's JSON
document (delivery/webhook.py); the headers carry `Nats-Msg-Id: treadle-<entry id>` (JetStream
drops a redelivery within its duplicate window on it) and `Treadle-Event: <kind>`.

Acknowledgement: with TREADLE_OUTBOX_NATS_JETSTREAM the stream's PubAck; otherwise the server
answering a flush (it has the message; core NATS keeps none for absent subscribers). Either
within the acknowledgement deadline, or the delivery failed and is retried like a webhook's.

nats-py is asynchronous: the sink keeps one connection on its own event loop thread, and the
relay's delivery threads hand it their publishes.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import TYPE_CHECKING, Any

from treadle.delivery.webhook import body_of
from treadle.domain.outbox import OutboxEntry, OutboxKind
from treadle.errors import ConfigError

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

#: The sink name entries for this sink carry.
SINK = "nats"
#: What a NATS subject token may not hold: whitespace, the wildcards, and the separator.
_NOT_IN_TOKEN = re.compile(r"[\s*>.]+")


def require_client() -> None:
    """ConfigError naming the extra when nats-py is not installed."""
    try:
        import nats  # noqa: F401
    except ImportError:
        raise ConfigError(
            "TREADLE_OUTBOX_NATS_URL is set, but the NATS client is not installed: "
            "pip install 'treadle[nats]' (nats-py)"
        ) from None


async def _ignore(error: Exception) -> None:
    """The client's error callback: each failed delivery reports its own error."""


def _token(text: str) -> str:
    return _NOT_IN_TOKEN.sub("_", text) or "_"


def subject_of(prefix: str, entry: OutboxEntry) -> str:
    """The subject `entry` is published on."""
    payload = entry.payload
    if entry.kind == OutboxKind.DATASET_PUBLISHED.value:
        name = str(payload.get("dataset", ""))
        return f"{prefix}.dataset." + ".".join(_token(part) for part in name.split("."))
    if entry.kind.startswith("alert.") or entry.kind in (
        OutboxKind.TASK_DEAD_LETTER.value,
        OutboxKind.FRESHNESS_MISS.value,
    ):
        kind = str(payload.get("alert") or entry.kind.removeprefix("alert."))
        return f"{prefix}.alert.{_token(kind)}.{_token(str(payload.get('dag_id') or 'system'))}"
    return f"{prefix}.{'.'.join(_token(part) for part in entry.kind.split('.'))}"


class NatsSink:
    """Publishes entries to the NATS server(s) at `url` (comma-separated for a cluster)."""

    def __init__(self, url: str, *, prefix: str, jetstream: bool, ack_s: float) -> None:
        require_client()
        self.servers = [u.strip() for u in url.split(",") if u.strip()]
        self.prefix, self.jetstream, self.ack_s = prefix, jetstream, ack_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="treadle-nats", daemon=True)
        self.thread.start()
        self.client: Client | None = None
        self.js: JetStreamContext | None = None
        self.connecting = asyncio.Lock()

    async def _connected(self) -> Client:
        async with self.connecting:
            if self.client is not None and not self.client.is_closed:
                return self.client
            import nats

            # Once connected the client reconnects on its own (publishes meanwhile fail their
            # acknowledgement); the first connect gets one deadline, then the delivery failed.
            self.client = await asyncio.wait_for(
                nats.connect(
                    servers=self.servers,
                    connect_timeout=max(self.ack_s, 0.5),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    error_cb=_ignore,
                ),
                timeout=self.ack_s,
            )
            self.js = self.client.jetstream(timeout=self.ack_s) if self.jetstream else None
            return self.client

    async def _publish(self, entry: OutboxEntry) -> None:
        client = await self._connected()
        subject = subject_of(self.prefix, entry)
        headers = {"Nats-Msg-Id": f"treadle-{entry.id}", "Treadle-Event": entry.kind}
        body = body_of(entry)
        if self.js is not None:
            await self.js.publish(subject, body, timeout=self.ack_s, headers=headers)
            return
        await client.publish(subject, body, headers=headers)
        await client.flush(timeout=self.ack_s)  # type: ignore[arg-type]  # seconds, any number

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Publish one entry; None once acknowledged, else what went wrong."""
        future = asyncio.run_coroutine_threadsafe(self._publish(entry), self.loop)
        try:
            # The connect and the publish each have the deadline; past twice that, give up.
            future.result(timeout=2 * self.ack_s + 1)
        except Exception as exc:  # any failure of the client is a failed delivery, retried
            future.cancel()
            return f"NATS {type(exc).__name__}: {exc or 'no answer'}"[:2000]
        return None

    def close(self) -> None:
        """Drain and close the connection, then stop the loop."""

        async def shut() -> None:
            if self.client is not None and not self.client.is_closed:
                await self.client.close()

        done: Any = asyncio.run_coroutine_threadsafe(shut(), self.loop)
        try:
            done.result(timeout=self.ack_s + 1)
        except Exception:  # closing a broken connection: nothing left to save
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
