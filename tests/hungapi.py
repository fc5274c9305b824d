"""An API server that hangs: a real TCP listener that accepts, reads each request and never
answers, recording every request (method and path, plain HTTP) and every one the client gave
up on (it closed the connection: its timeout fired).

It starts *refusing* (the port is bound but not listening: connections fail at once, as to a
stopped API server) and hangs from `hang()` on, so a test can let a component start quickly
and then freeze its API server under it. Given `answers` (path -> JSON document), it starts
instead by answering a GET of one of those paths with its document and every other request
with 503 (at once, one request per connection), as a server that is up but serves only what
the test names; from `hang()` on it hangs all the same. Only the requests it holds are
recorded in `requests`. `close()` ends every held connection."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    abandoned_before: int  # requests the client had given up on when this one arrived
    abandoned: bool = False


class HungApi:
    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._closed = False
        self._answers = answers
        self._hanging = answers is None
        if answers is not None:
            self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def hang(self) -> None:
        """From now on: accept, read, never answer."""
        with self._lock:
            was_hanging, self._hanging = self._hanging, True
        if was_hanging:  # not listening yet
            self._listen()

    def _listen(self) -> None:
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
                hanging = self._hanging
                if hanging:
                    request = Request(method, path, sum(r.abandoned for r in self.requests))
                    self.requests.append(request)
            if not hanging:
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")[1:]
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:  # read it all: closing on unread data resets
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                self._answer(conn, method, path)
                return
            # Never answered: only the client's own timeout (closing the socket) ends it.
            while conn.recv(65536):
                pass
        except OSError:
            return
        with self._lock:
            if not self._closed:
                request.abandoned = True

    def _answer(self, conn: socket.socket, method: str, path: str) -> None:
        """Before `hang()`, with `answers`: the named document, or 503; then the connection
        is closed."""
        doc = (self._answers or {}).get(path.split("?", 1)[0]) if method == "GET" else None
        status = "200 OK" if doc is not None else "503 Service Unavailable"
        if doc is None:
            doc = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503}
        body = json.dumps(doc).encode()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            conn.sendall(head.encode() + body)
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)

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
