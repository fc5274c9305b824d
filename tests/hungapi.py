"""An API server that hangs: a real TCP listener that accepts, reads each request and never
answers, recording every request (method and path, plain HTTP) and every one the client gave
up on (it closed the connection: its timeout fired).

It starts *refusing* (the port is bound but not listening: connections fail at once, as to a
stopped API server) and hangs from `hang()` on, so a test can let a component start quickly
and then freeze its API server under it. `close()` ends every held connection."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass


@dataclass
class Request:
    method: str
    path: str
    abandoned_before: int  # requests the client had given up on when this one arrived
    abandoned: bool = False


class HungApi:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def hang(self) -> None:
        """From now on: accept, read, never answer."""
        self.sock.listen(64)
        threading.Thread(target=self._accept, name="hung-api", daemon=True).start()

    def abandoned(self) -> int:
        """Requests whose client gave up (closed the connection) so far."""
        with self._lock:
            return sum(r.abandoned for r in self.requests)

    def paths(self, method: str = "GET") -> list[str]:
        with self._lock:
            return [r.path for r in self.requests if r.method == method]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            method, path = data.split(b"\r\n", 1)[0].decode().split(" ")[:2]
            with self._lock:
                request = Request(method, path, sum(r.abandoned for r in self.requests))
                self.requests.append(request)
            # Never answered: only the client's own timeout (closing the socket) ends it.
            while conn.recv(65536):
                pass
        except OSError:
            return
        with self._lock:
            if not self._closed:
                request.abandoned = True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        with contextlib.suppress(OSError):  # never listened
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        self.sock.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
