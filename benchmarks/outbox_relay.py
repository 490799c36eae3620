"""Outbox relay throughput: events delivered per second to a local webhook receiver (or, with
`--sink nats`, published to the local NATS server at 127.0.0.1:4222, acknowledged by a flush,
counted by a subscriber).

A fresh PostgreSQL database gets `--events` pending outbox entries (dataset events); this process
takes the leader lease and runs the relay's rounds (claim 200, post 16 at a time over kept-alive
connections, settle in one transaction, each step fenced by the epoch) until none is pending.
The receiver is a threaded HTTP server in a child process that answers 204 and counts the
deliveries it got. Prints one JSON object; target: at least 1,000 events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from _common import emit, machine, pg_database

from treadle.delivery.relay import OutboxRelay, Sink
from treadle.delivery.webhook import SINK, WebhookSink
from treadle.domain.outbox import DeliveryPolicy, OutboxKind, OutboxState
from treadle.engine.leadership import Leadership
from treadle.engine.outbox import list_entries, outbox_stats
from treadle.store import migrate
from treadle.store import outbox as outbox_store
from treadle.store.database import Database, db_now


def serve(port_out: Any, counter: Any) -> None:  # Any: multiprocessing proxies
    """The receiver: 204 to every POST, counted."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver behind a proxy would

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            with counter.get_lock():
                counter.value += 1
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


class NatsCounter:
    """Counts the messages published under `prefix` (a subscriber on its own loop thread)."""

    def __init__(self, prefix: str) -> None:
        self.value = 0
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(prefix), self.loop).result(timeout=30)

    async def _start(self, prefix: str) -> None:
        import nats

        self.client = await nats.connect("nats://127.0.0.1:4222")

        async def take(msg: Any) -> None:
            self.value += 1

        await self.client.subscribe(f"{prefix}.>", cb=take)
        await self.client.flush()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def main() -> None:
    """Fill the outbox, drain it through the relay, print the rate."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=5000, help="outbox entries to deliver")
    parser.add_argument("--sink", choices=["webhook", "nats"], default="webhook")
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    nats_counter = NatsCounter(prefix) if args.sink == "nats" else None
    ports: Any = multiprocessing.Queue()
    counter: Any = multiprocessing.Value("i", 0)
    receiver = multiprocessing.Process(target=serve, args=(ports, counter), daemon=True)
    receiver.start()
    port = ports.get(timeout=30)
    try:
        with pg_database("bench_outbox") as url:
            db = Database(url, application_name="treadle-bench-outbox")
            migrate.upgrade(db)
            payloads = [{"dataset": f"warehouse.t{n % 50}", "version": str(n)} for n in range(args.events)]
            db.transact(
                lambda conn: outbox_store.enqueue(
                    conn,
                    kind=OutboxKind.DATASET_PUBLISHED.value,
                    sink=SINK,  # one sink: the relay hands every entry to it
                    payloads=payloads,
                    now=db_now(conn),
                )
            )
            leader = Leadership(db, holder="bench", lease_s=60)
            assert leader.refresh()
            sink: Sink
            if args.sink == "nats":
                from treadle.delivery.nats import NatsSink

                sink = NatsSink("nats://127.0.0.1:4222", prefix=prefix, jetstream=False, ack_s=10)
            else:
                sink = WebhookSink(f"http://127.0.0.1:{port}/hook", secret="bench-secret", ack_s=10)
            relay = OutboxRelay(db, leader, sink, policy=DeliveryPolicy(), ack_s=10)
            began = time.perf_counter()
            rounds = 0
            while outbox_stats(db).pending:
                relay.round()
                rounds += 1
            elapsed = time.perf_counter() - began
            relay.pool.shutdown()
            relay.database.shutdown()
            sink.close()
            delivered = len(list_entries(db, state=OutboxState.DELIVERED.value, limit=args.events))
            db.dispose()
    finally:
        receiver.terminate()
    if nats_counter is not None:
        deadline = time.monotonic() + 30
        while nats_counter.value < args.events and time.monotonic() < deadline:
            time.sleep(0.05)
        nats_counter.close()
    rate = round(args.events / elapsed, 1)
    emit(
        {
            "benchmark": "outbox_relay",
            "backend": "postgresql",
            "settings": vars(args),
            "machine": machine(),
            "events_per_s": rate,
            "seconds": round(elapsed, 3),
            "rounds": rounds,
            "delivered_rows": delivered,
            "sink": args.sink,
            "received": counter.value if nats_counter is None else nats_counter.value,
            "target": {"events_per_s_at_least": 1000},
            "meets_target": rate >= 1000,
        }
    )


if __name__ == "__main__":
    main()
