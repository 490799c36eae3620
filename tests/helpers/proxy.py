"""A TCP proxy that can freeze: a network path to the database that stops carrying bytes.

While frozen it reads nothing from either side and closes nothing, like a partition or a peer
that stopped answering: the client's statement is sent (the proxy's kernel acknowledges it) and
no answer ever comes. Neither a server-side statement timeout (the server never sees the
statement) nor TCP keepalives (the proxy's socket is alive) end such a call.
"""

from __future__ import annotations

import selectors
import socket
import threading


class FreezableProxy:
    """Forwards 127.0.0.1:`port` to `target` until frozen; `close()` ends every connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ)
            sel.register(b, selectors.EVENT_READ)
            while not self._closed.is_set():
                if self.frozen.is_set():
                    self._closed.wait(0.05)
                    continue
                for key, _ in sel.select(0.1):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = src.recv(65536)
                        if data:
                            peer[src].sendall(data)
                            continue
                    except OSError:
                        pass
                    # One side closed (a client that gave up on a call, say): close the other,
                    # as TCP would once the path carries bytes again. Left open, the server
                    # would keep that session, and its transaction's row locks, alive.
                    for s in (a, b):
                        try:
                            s.close()
                        except OSError:
                            pass
                    return

    def close(self) -> None:
        """Stop forwarding and close every socket."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.close()
                except OSError:
                    pass
