"""API errors are typed by what a caller does with them, and callers catch them by type.

A real HTTP server answers each request with the status the test names (a Kubernetes
`Status` body, as kube-apiserver sends); the REST layer must raise the matching subclass. The
last test reads the product source: no module but the REST layer compares status codes."""

from __future__ import annotations

import ast
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client

from fabricdra.kube.rest import (
    CLAIMS,
    NODES,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    Rest,
    Throttled,
)

from .sources import parsed

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "cli", "controller", "kube", "kubeletplugin")
REST_MODULE = ROOT / "kube" / "fabricdra" / "kube" / "rest.py"

TYPED: dict[int, type[ApiError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Throttled,
}


class StatusServer:
    """Answers every request with `status` and a Status body naming it."""

    def __init__(self) -> None:
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps(
                    {"kind": "Status", "code": outer.status, "message": f"said {outer.status}"}
                ).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() returns at the loop's next poll: its default 0.5 s was each test's teardown.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def rest(self) -> Rest:
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return Rest(client.ApiClient(config))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[StatusServer]:
    s = StatusServer()
    yield s
    s.close()


@pytest.mark.parametrize("status", sorted(TYPED))
def test_the_rest_layer_raises_the_type_for_each_status(server: StatusServer, status: int) -> None:
    server.status = status
    with pytest.raises(TYPED[status]) as e:
        server.rest().get(CLAIMS, "c", "ns", timeout=5.0)
    assert e.value.status == status
    assert e.value.message == f"said {status}"
    assert isinstance(e.value, ApiError)  # a caller that handles any failure still catches it


def test_other_statuses_are_the_base_class(server: StatusServer) -> None:
    server.status = 500
    with pytest.raises(ApiError) as e:
        server.rest().create(NODES, {"metadata": {"name": "n"}}, timeout=5.0)
    assert type(e.value) is ApiError
    assert e.value.status == 500


def test_get_or_none_and_delete_treat_not_found_as_absent(server: StatusServer) -> None:
    server.status = 404
    rest = server.rest()
    assert rest.get_or_none(NODES, "n") is None
    assert rest.delete(NODES, "n") is False
    server.status = 403  # not found is absent; forbidden is not
    with pytest.raises(Forbidden):
        rest.get_or_none(NODES, "n")


@pytest.mark.parametrize("status", [*sorted(TYPED), 0, 500, 503])
def test_an_error_built_anywhere_has_its_status_type(status: int) -> None:
    """A watch's ERROR event and a test's fake build `ApiError(code, ...)` too: a 410 from a
    watch must be a Gone, or the informer would not re-list."""
    e = ApiError(status, "m")
    assert type(e) is TYPED.get(status, ApiError)
    assert (e.status, e.message, str(e)) == (status, "m", f"{status}: m")


def test_no_status_code_properties_to_compare_with() -> None:
    """Callers catch the type; the old boolean properties are gone, so none can creep back."""
    for name in ("not_found", "conflict", "gone"):
        assert not hasattr(ApiError(404, "m"), name)


def _int_constants(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_int_constants(e) for e in node.elts)
    return False


def test_no_module_but_the_rest_layer_compares_status_codes() -> None:
    """`e.status == 409`, `e.status not in (409, 422)` and the like: a caller that compares
    codes decides by a number the type already says."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package / "fabricdra").rglob("*.py")):
            if path == REST_MODULE:
                continue
            for node in ast.walk(parsed(path)):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                on_status = any(
                    isinstance(s, ast.Attribute) and s.attr in ("status", "code") for s in sides
                )
                if on_status and any(_int_constants(s) for s in sides):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"status codes compared outside kube/rest.py: {found}"


def test_nothing_reads_the_old_properties() -> None:
    """Tests, benches and e2e helpers catch by type too: `e.not_found` on an ApiError would be
    an AttributeError at the worst moment (an integration fixture's clean-up)."""
    found = []
    for top in (*PACKAGES, "tests", "bench", "e2e"):
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text()
            if "not_found" not in text and "conflict" not in text:
                continue  # an attribute's name is in its file's text: walking 3 MB took 2 s
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.Attribute) and node.attr in ("not_found", "conflict"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"ApiError.not_found/.conflict are gone; catch NotFound/Conflict: {found}"
