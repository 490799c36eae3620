"""A NATS subscriber for outbox tests, on the machine's server (127.0.0.1:4222): collects what
arrives on a subject in a thread of its own, and helpers for JetStream streams."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from typing import Any

import pytest

URL = "nats://127.0.0.1:4222"


def require_server() -> None:
    """Skip when no NATS server listens locally (CI provides one)."""
    try:
        socket.create_connection(("127.0.0.1", 4222), timeout=2).close()
    except OSError:
        pytest.skip("no NATS server on 127.0.0.1:4222")


def unique_prefix() -> str:
    """A subject prefix no other test (or process) publishes under."""
    return f"treadletest.{uuid.uuid4().hex[:12]}"


def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Subscriber:
    """Subscribed to `subject` (wildcards allowed) until closed; `messages` holds (subject,
    headers, body) in arrival order."""

    def __init__(self, subject: str, *, url: str = URL) -> None:
        self.messages: list[tuple[str, dict[str, str], bytes]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client: Any = None
        asyncio.run_coroutine_threadsafe(self._start(subject, url), self.loop).result(timeout=30)

    async def _start(self, subject: str, url: str) -> None:
        import nats

        self.client = await nats.connect(url)

        async def take(msg: Any) -> None:
            self.messages.append((msg.subject, dict(msg.headers or {}), msg.data))

        await self.client.subscribe(subject, cb=take)
        await self.client.flush()

    def run(self, coroutine: Any) -> Any:
        """Run a coroutine (given the connected client) on the subscriber's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine(self.client), self.loop).result(timeout=30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
