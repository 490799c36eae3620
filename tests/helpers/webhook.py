"""A local webhook receiver for outbox tests: records every POST and answers `status`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Listens on a free port of 127.0.0.1 at `url`; `received` holds (headers, body) per POST."""

    def __init__(self, *, status: int = 200, path: str = "/hook") -> None:
        self.status = status
        self.received: list[tuple[dict[str, str], bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.received.append((dict(self.headers), body))
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the loop to look at its flag: every 0.05 s, not the default 0.5 s.
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies received, in order."""
        return [json.loads(body) for _, body in self.received]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
