"""LISTEN for "a task became ready" on PostgreSQL. A latency hint only: callers always poll too."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import psycopg

from treadle.store.dialects import READY_CHANNEL

log = logging.getLogger("treadle.store.notifications")


def listen_ready(url: str, *, on_notify: Callable[[], None], stop: threading.Event) -> None:
    """Call `on_notify` for each ready notification until `stop` is set.

    Every (re)connection re-LISTENs and calls `on_notify` once at once, so a notification lost
    while disconnected costs at most one poll, never a stuck task (F6).
    """
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    failures = 0
    while not stop.is_set():
        try:
            with psycopg.connect(
                dsn, autocommit=True, application_name="treadle-listen", connect_timeout=5
            ) as conn:
                conn.execute(f"LISTEN {READY_CHANNEL}")
                failures = 0
                on_notify()
                while not stop.is_set():
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        on_notify()
                    conn.execute("SELECT 1")  # detects a dead connection between notifications
        except psycopg.Error as exc:
            failures += 1
            delay = min(0.2 * 2**failures, 10.0) * (0.5 + random.random())
            log.warning(
                "listen connection lost",
                extra={"event": "worker.listen_lost", "error": str(exc)[:200]},
            )
            stop.wait(delay)
