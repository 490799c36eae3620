"""The small HTTP port of a scheduler or worker process: /metrics, /healthz and /readyz.

Off unless TREADLE_METRICS_PORT is set. Plain http.server on a daemon thread: no framework in
processes that serve nothing else, and a probe never waits behind the process's own work.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from treadle.observability.health import ProcessCheck, run_checks
from treadle.observability.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("treadle.observability")


class ProcessServer:
    """Serves one process's metrics and probes until `stop`."""

    def __init__(self, metrics: Metrics, checks: list[ProcessCheck], *, host: str, port: int) -> None:
        self.metrics, self.checks = metrics, checks
        handler = type("Handler", (_Handler,), {"owner": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="treadle-metrics", daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on (the one asked for, or the one picked for port 0)."""
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        """Serve on a thread of its own."""
        self.thread.start()
        log.info("metrics and probes served", extra={"event": "metrics.serving", "port": self.port})

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def readiness(self) -> tuple[int, bytes]:
        """HTTP status and JSON body of /readyz."""
        results = run_checks(self.checks)
        ok = all(r.ok for r in results)
        body = {
            "status": "ok" if ok else "unavailable",
            "checks": [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in results],
        }
        return (200 if ok else 503), json.dumps(body).encode()


class _Handler(BaseHTTPRequestHandler):
    owner: ProcessServer

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, self.owner.metrics.exposition(), CONTENT_TYPE)
        elif self.path == "/healthz":
            body = {"status": "ok", "checks": [{"name": "process", "ok": True, "detail": "serving"}]}
            self._send(200, json.dumps(body).encode(), "application/json")
        elif self.path == "/readyz":
            status, payload = self.owner.readiness()
            self._send(status, payload, "application/json")
        else:
            self._send(404, b'{"status": "not found"}', "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds are not worth a log line each."""
