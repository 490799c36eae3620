"""Outbox relay throughput: events delivered per second to a local webhook receiver (or, with
`--sink nats`, published to the local NATS server at 127.0.0.1:4222, acknowledged by a flush,
counted by a subscriber).

A fresh PostgreSQL database gets `--events` pending outbox entries (dataset events); this process
takes the leader lease and runs the relay's rounds (claim 500, post 32 at a time over kept-alive
connections, settle in one transaction, each step fenced by the epoch) until none is pending.
The receiver, in a child process, is an asyncio HTTP/1.1 server (or, with `--receiver threaded`,
http.server's threaded one), both keeping connections alive: it verifies every body's HMAC
signature, answers 204, and counts the deliveries and their distinct ids, so the figures show
every entry arrived exactly once. Prints one JSON object; target: at least 1,000 events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import multiprocessing
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from _common import emit, machine, pg_database

from treadle.delivery.relay import OutboxRelay, Sink
from treadle.delivery.webhook import SINK, WebhookSink, signature
from treadle.domain.outbox import DeliveryPolicy, OutboxKind, OutboxState
from treadle.engine.leadership import Leadership
from treadle.engine.outbox import list_entries, outbox_stats
from treadle.store import migrate
from treadle.store import outbox as outbox_store
from treadle.store.database import Database, db_now

SECRET = "bench-secret"


class Tally:
    """What a receiver saw: deliveries, distinct delivery ids, bodies whose signature failed."""

    def __init__(self) -> None:
        self.posts = 0
        self.ids: set[str] = set()
        self.bad_signatures = 0
        #: TCP connections accepted (kept alive: about as many as the posts in flight).
        self.connections = 0

    def take(self, headers: dict[str, str], body: bytes) -> bool:
        """Verify the body's HMAC and count its delivery id; False when the signature is wrong."""
        self.posts += 1
        expected = signature(SECRET, timestamp=headers.get("x-treadle-timestamp", ""), body=body)
        if not hmac.compare_digest(expected, headers.get("x-treadle-signature", "")):
            self.bad_signatures += 1
            return False
        self.ids.add(headers.get("x-treadle-delivery", ""))
        return True

    def report(self) -> dict[str, int]:
        return {
            "posts": self.posts,
            "distinct_ids": len(self.ids),
            "bad_signatures": self.bad_signatures,
            "connections": self.connections,
        }


def serve_threaded(port_out: Any, reports: Any) -> None:  # Any: multiprocessing queues
    """A threaded receiver (http.server, HTTP/1.1 keep-alive): 204 to every signed POST."""
    tally, lock = Tally(), threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver behind a proxy would

        def setup(self) -> None:
            super().setup()
            with lock:
                tally.connections += 1

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                ok = tally.take({k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(204 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=_report_when_asked, args=(reports, tally), daemon=True).start()
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


def _report_when_asked(reports: Any, tally: Tally) -> None:
    reports.get()  # the parent asks once the relay is done
    reports.put(tally.report())


def serve_asyncio(port_out: Any, reports: Any) -> None:  # Any: multiprocessing queues
    """An asyncio receiver: HTTP/1.1 with keep-alive, one task per connection, 204 to every
    signed POST (401 to a bad signature)."""
    tally = Tally()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tally.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                ok = tally.take(headers, body)
                status = b"204 No Content" if ok else b"401 Unauthorized"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", 0, backlog=256)
        port_out.put(server.sockets[0].getsockname()[1])
        threading.Thread(target=_report_when_asked, args=(reports, tally), daemon=True).start()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


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
    parser.add_argument(
        "--receiver",
        choices=["asyncio", "threaded"],
        default="asyncio",
        help="the local webhook receiver: an asyncio server or http.server's threaded one",
    )
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    nats_counter = NatsCounter(prefix) if args.sink == "nats" else None
    ports: Any = multiprocessing.Queue()
    reports: Any = multiprocessing.Queue()
    serve = serve_asyncio if args.receiver == "asyncio" else serve_threaded
    receiver = multiprocessing.Process(target=serve, args=(ports, reports), daemon=True)
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
                sink = WebhookSink(f"http://127.0.0.1:{port}/hook", secret=SECRET, ack_s=10)
            relay = OutboxRelay(db, leader, sink, policy=DeliveryPolicy(), ack_s=10)
            began = time.perf_counter()
            cpu_began = time.process_time()
            rounds = 0
            while outbox_stats(db).pending:
                relay.round()
                rounds += 1
            elapsed = time.perf_counter() - began
            cpu = {
                "relay_process": round(time.process_time() - cpu_began, 2),
                "relay_ms_per_event": round((time.process_time() - cpu_began) * 1000 / args.events, 3),
            }
            relay.pool.shutdown()
            relay.database.shutdown()
            sink.close()
            delivered = len(list_entries(db, state=OutboxState.DELIVERED.value, limit=args.events))
            db.dispose()
        reports.put("report")
        seen = reports.get(timeout=30) if args.sink == "webhook" else {}
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
            "receiver": args.receiver if args.sink == "webhook" else None,
            "received": seen.get("posts", 0) if nats_counter is None else nats_counter.value,
            "distinct_ids": seen.get("distinct_ids"),
            "bad_signatures": seen.get("bad_signatures"),
            "connections": seen.get("connections"),
            "every_entry_once": seen.get("distinct_ids") == args.events == delivered
            if args.sink == "webhook"
            else None,
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "cpu_s": cpu,
            "target": {"events_per_s_at_least": 1000},
            "meets_target": rate >= 1000,
        }
    )


if __name__ == "__main__":
    main()
