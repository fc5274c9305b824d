"""The REST layer makes exactly one attempt per call: a timeout bounds the whole call.

The API server here is a real peer that accepts connections, reads the request and never
answers (what a stalled API server looks like to a client); it records every request it
received, so "how many attempts" is counted, not timed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from fabricdra.kube.rest import CLAIMS, NODES, ApiError, Rest

SENTINEL = b"SENTINEL"


class SilentServer:
    """Accepts, reads what the client sends, never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.requests: list[bytes] = []
        self.sentinel = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)  # kept open: the client sees a peer that never answers
            first = conn.recv(4096)
            if first.startswith(SENTINEL):
                self.sentinel.set()
            else:
                self.requests.append(first)

    def attempts(self) -> int:
        """Requests received before the test's own sentinel connection: connections are
        accepted in order, so every attempt of the finished call is counted by then."""
        with socket.create_connection(self.sock.getsockname()) as s:
            s.sendall(SENTINEL)
            assert self.sentinel.wait(10)
        self.sentinel.clear()
        return len(self.requests)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    s = SilentServer()
    yield s
    s.close()


def rest_for(url: str) -> Rest:
    config = client.Configuration()
    config.host = url
    return Rest(client.ApiClient(config))


def test_a_get_that_times_out_is_not_retried(silent: SilentServer) -> None:
    """urllib3's default (3 retries) turns a 30 s GET into 120 s."""
    with pytest.raises(ApiError) as e:
        rest_for(silent.url).get(CLAIMS, "c", "ns", timeout=0.3)
    assert e.value.status == 0
    assert silent.attempts() == 1


def test_no_verb_retries_hidden_in_the_pool(silent: SilentServer) -> None:
    rest = rest_for(silent.url)
    with pytest.raises(ApiError):
        rest.call("GET", NODES.path(name="n"), timeout=0.3)
    assert silent.attempts() == 1
    with pytest.raises(ApiError):
        rest.call("PATCH", NODES.path(name="n"), body={}, timeout=0.3)
    assert silent.attempts() == 2
