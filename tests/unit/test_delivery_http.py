"""The kept-alive HTTP poster every HTTP sink sends with (delivery/http.py), and the Slack and
OpenLineage sinks' answers to a failing or slow receiver."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from treadle.delivery.http import KeepAlivePoster
from treadle.delivery.lineage import OpenLineageSink
from treadle.delivery.slack import SlackSink
from treadle.domain.outbox import OutboxEntry, OutboxKind

LINEAGE_PAYLOAD = {
    "eventType": "START",
    "eventTime": "2026-01-01T00:00:00+00:00",
    "namespace": "tests",
    "job": "orders.extract",
    "runId": "0191e4a0-0000-7000-8000-000000000001",
    "inputs": [],
    "outputs": ["orders"],
}


class Server:
    """A local receiver answering `status` with `body` after `delay_s`; counts the connections
    it accepted and records each request's path and headers."""

    def __init__(self) -> None:
        self.status, self.body, self.delay_s, self.close_after = 200, b"", 0.0, False
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.ports: set[int] = set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                # The answer is read once: the test may change it as soon as the client has one.
                status, answer, delay_s, close = owner.status, owner.body, owner.delay_s, owner.close_after
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append((self.path, dict(self.headers), body))
                owner.ports.add(self.client_address[1])
                time.sleep(delay_s)
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                self.close_connection = close  # without saying so: the client finds out on its next post

            def log_message(self, *args: Any) -> None:
                pass

        class Quiet(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the answer to a client that timed out finds the connection closed

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/in?x=1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _entry(kind: str, payload: dict[str, Any]) -> OutboxEntry:
    now = datetime.now(UTC)
    return OutboxEntry(
        id=7,
        kind=kind,
        sink="x",
        payload=payload,
        state="pending",
        attempts=0,
        next_attempt_at=now,
        created_at=now,
    )


def test_any_2xx_is_taken_and_posts_share_one_kept_alive_connection(server: Server) -> None:
    poster = KeepAlivePoster(server.url, ack_s=5)
    try:
        server.status = 204
        assert poster.post(b"{}", {"Content-Type": "application/json"}) is None
        server.status = 202
        assert poster.post(b"{}", {"Content-Type": "application/json"}) is None
    finally:
        poster.close()
    assert len(server.requests) == 2 and len(server.ports) == 1
    path, headers, body = server.requests[0]
    assert path == "/in?x=1" and body == b"{}" and headers["Host"] == server.url.split("/")[2]


def test_a_non_2xx_is_the_status_and_the_first_500_characters_of_the_body(server: Server) -> None:
    server.status, server.body = 503, b"busy " + b"x" * 1000
    poster = KeepAlivePoster(server.url, ack_s=5)
    try:
        assert poster.post(b"{}", {}) == "HTTP 503: busy " + "x" * 495
    finally:
        poster.close()


def test_a_receiver_slower_than_the_deadline_is_a_timeout(server: Server) -> None:
    server.delay_s = 1.0
    poster = KeepAlivePoster(server.url, ack_s=0.2)
    try:
        started = time.monotonic()
        error = poster.post(b"{}", {})
        assert error is not None and error.startswith("TimeoutError: "), error
        assert time.monotonic() - started < 0.9
    finally:
        poster.close()


def test_a_refused_connection_is_a_failure_in_words() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    poster = KeepAlivePoster(f"http://127.0.0.1:{port}/", ack_s=1)
    error = poster.post(b"{}", {})
    assert error is not None and error.startswith("ConnectionRefusedError: "), error


def test_a_connection_the_receiver_closed_is_replaced(server: Server) -> None:
    server.close_after = True
    poster = KeepAlivePoster(server.url, ack_s=5)
    try:
        assert [poster.post(b"{}", {}) for _ in range(3)] == [None, None, None]
    finally:
        poster.close()
    assert len(server.ports) == 3


def test_only_http_and_https_urls_with_a_host_are_taken() -> None:
    for url in ("ftp://host/x", "http:///path", "host:80"):
        with pytest.raises(ValueError, match="http:// or https://"):
            KeepAlivePoster(url, ack_s=1)


def test_the_slack_sink_reports_a_non_2xx_and_a_timeout(server: Server) -> None:
    sink = SlackSink(server.url, ack_s=0.2)
    alert = _entry("alert", {"alert": "run_failed", "severity": "error", "summary": "orders failed"})
    try:
        assert sink.deliver(alert) is None
        assert b"orders failed" in server.requests[-1][2]
        server.status, server.body = 404, b"no_service"
        assert sink.deliver(alert) == "HTTP 404: no_service"
        server.status, server.delay_s = 200, 1.0
        error = sink.deliver(alert)
        assert error is not None and error.startswith("TimeoutError: "), error
    finally:
        sink.close()


def test_the_openlineage_sink_reports_a_non_2xx_and_a_timeout(server: Server) -> None:
    sink = OpenLineageSink(url=server.url, file=None, ack_s=0.2)
    event = _entry(OutboxKind.LINEAGE.value, LINEAGE_PAYLOAD)
    try:
        assert sink.deliver(event) is None
        assert server.requests[-1][1]["Content-Type"] == "application/json"
        server.status, server.body = 400, b'{"error": "bad event"}'
        assert sink.deliver(event) == 'HTTP 400: {"error": "bad event"}'
        server.status, server.delay_s = 200, 1.0
        error = sink.deliver(event)
        assert error is not None and error.startswith("TimeoutError: "), error
    finally:
        sink.close()


def test_an_http_receiver_behind_a_proxy_is_posted_through_it_with_its_credentials(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = server.url.split("/")[2]
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://relay:s%40cret@{proxy}")
    poster = KeepAlivePoster("http://receiver.invalid:8080/hooks/in?x=1", ack_s=5)
    try:
        assert poster.post(b"{}", {}) is None
    finally:
        poster.close()
    path, headers, _ = server.requests[-1]
    assert path == "http://receiver.invalid:8080/hooks/in?x=1"
    assert headers["Host"] == "receiver.invalid:8080"
    assert headers["Proxy-Authorization"] == "Basic " + base64.b64encode(b"relay:s@cret").decode()


def test_no_proxy_hosts_are_reached_directly(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = free.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    poster = KeepAlivePoster(server.url, ack_s=5)
    try:
        assert poster.post(b"{}", {}) is None
    finally:
        poster.close()
    assert server.requests[-1][0] == "/in?x=1"


def test_an_https_receiver_behind_a_proxy_is_reached_through_a_connect_tunnel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def refuse_the_tunnel() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            seen.append(data)
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=refuse_the_tunnel, daemon=True)
    thread.start()
    for name in ("https_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://relay:pw@127.0.0.1:{listener.getsockname()[1]}")
    poster = KeepAlivePoster("https://hooks.example.invalid/in", ack_s=5)
    try:
        error = poster.post(b"{}", {})
    finally:
        poster.close()
        thread.join(timeout=30)
        listener.close()
    assert error is not None and "403" in error, error
    request = seen[0].decode()
    assert request.startswith("CONNECT hooks.example.invalid:443 HTTP/1."), request
    assert "Proxy-Authorization: Basic " + base64.b64encode(b"relay:pw").decode() in request


def test_a_proxy_that_is_not_http_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(ValueError, match="HTTPS_PROXY must be an http:// proxy URL"):
        KeepAlivePoster("https://hooks.example.invalid/in", ack_s=1)
