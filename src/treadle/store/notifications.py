"""Listen for wake-ups: LISTEN on PostgreSQL, datagram sockets beside a SQLite file
(store/wakeups.py). A latency hint only: callers always poll too.

psycopg is imported only for a PostgreSQL URL: a SQLite-only install has none."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping

from treadle.store import wakeups

log = logging.getLogger("treadle.store.notifications")

#: Seconds between two checks of an idle LISTEN connection (and of `stop`). A server that ends
#: the session is noticed at once (the socket turns readable); this is for the silent cases.
CHECK_S = 5.0


def listen(url: str, *, handlers: Mapping[str, Callable[[], None]], stop: threading.Event) -> None:
    """Call the handler of each channel that is notified, until `stop` is set.

    Every (re)connection re-LISTENs and calls every handler once at once, so a notification
    lost while disconnected costs at most one poll, never a stuck task (F6).

    On SQLite the same, over the database's wake-up folder; returns at once where there is none
    (in-memory database, or an unusable folder: polling alone).
    """
    if url.startswith("sqlite"):
        folder = wakeups.for_url(url)
        if folder is not None:
            wakeups.listen(folder, handlers=handlers, stop=stop)
        return
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    failures = 0
    while not stop.is_set():
        try:
            with psycopg.connect(
                dsn,
                autocommit=True,
                application_name="treadle-listen",
                connect_timeout=5,
                # A silently dropped connection is noticed by the kernel within about 25 s.
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
            ) as conn:
                for channel in handlers:
                    conn.execute(f"LISTEN {channel}")
                failures = 0
                for handler in handlers.values():
                    handler()
                while not stop.is_set():
                    for notice in conn.notifies(timeout=CHECK_S, stop_after=1):
                        on_notice = handlers.get(notice.channel)
                        if on_notice is not None:
                            on_notice()
                    conn.execute("SELECT 1")  # detects a dead connection between notifications
        except psycopg.Error as exc:
            failures += 1
            delay = min(0.2 * 2**failures, 10.0) * (0.5 + random.random())
            log.warning(
                "listen connection lost", extra={"event": "worker.listen_lost", "error": str(exc)[:200]}
            )
            stop.wait(delay)
