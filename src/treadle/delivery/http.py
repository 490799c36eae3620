"""POSTs to one URL over kept-alive HTTP/1.1 connections, the way every HTTP sink sends.

The relay posts from many threads at once; each thread keeps its own connection alive (the
standard library's http.client: an httpx client shared by 32 threads cost about 2.8 ms of CPU
per post on the benchmark machine, this about 0.35 ms, see docs/performance.md). HTTPS checks
the receiver's certificate against the system's trust store (ssl.create_default_context).

A post is taken when the receiver answers any 2xx within the acknowledgement deadline; otherwise
`post` returns what went wrong, in words: the exception (a timeout, a refused or reset
connection, a TLS failure) or `HTTP <status>: <the first 500 characters of the body>`.

A receiver behind an HTTP proxy is reached the way curl and urllib reach it: `HTTPS_PROXY` /
`HTTP_PROXY` (either case) name the proxy, `NO_PROXY` the hosts that bypass it; https goes
through a CONNECT tunnel (the receiver's certificate is still checked end to end), http is sent
to the proxy with the absolute URL. Credentials in the proxy URL go as Proxy-Authorization.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: where to connect, and the Proxy-Authorization header if it has credentials."""

    host: str
    port: int
    headers: dict[str, str]


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The proxy the environment names for `scheme://host`, or None (none set, or NO_PROXY)."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{scheme.upper()}_PROXY must be an http:// proxy URL with a host, got {url!r}")
    headers = {}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode()
    return Proxy(parts.hostname, parts.port or 80, headers)


class KeepAlivePoster:
    """Posts to `url` (http:// or https://), each posting thread over its own kept-alive
    connection, waiting at most `ack_s` seconds for each connect, send and answer (safe to share
    between threads)."""

    def __init__(self, url: str, *, ack_s: float, name: str = "the") -> None:
        """`name` is the sink's, for the error about a URL it cannot post to."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{name} URL must be http:// or https:// with a host, got {url!r}")
        self.url, self.ack_s = url, ack_s
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._host_header = parts.netloc.rpartition("@")[2]
        self._tls = ssl.create_default_context() if self._https else None
        self._proxy = proxy_for(parts.scheme, parts.hostname)
        self._proxy_headers: dict[str, str] = {}
        if self._proxy is not None and not self._https:
            # A plain-http proxy is sent the absolute URL, and its credentials with each request.
            self._target = f"http://{self._host_header}{self._target}"
            self._proxy_headers = self._proxy.headers
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before (it may have been closed)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        proxy = self._proxy
        host, port = (self._host, self._port) if proxy is None else (proxy.host, proxy.port)
        if self._https:
            conn = http.client.HTTPSConnection(host, port, timeout=self.ack_s, context=self._tls)
            if proxy is not None:
                conn.set_tunnel(self._host, self._port or 443, headers=proxy.headers)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.ack_s)
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

    def post(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """POST `body` with `headers` (Host is added); None when the receiver took it (any 2xx),
        else what went wrong."""
        sent = {"Host": self._host_header, **self._proxy_headers, **headers}
        while True:
            conn, reused = self._connection()
            try:
                conn.request("POST", self._target, body=body, headers=sent)
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
