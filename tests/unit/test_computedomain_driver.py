"""The compute-domain kubelet driver's safety rules, over a real HTTP API server on a local
port (it answers claims and ComputeDomains from documents the test gives it, and holds the
reads of chosen paths until the test releases them) and real gRPC over unix sockets: API
reads happen before any lock, in one attempt, within a budget below kubelet's deadline; a
slow claim (a hung read, IMEX not ready) delays no other claim; work stops once kubelet has
gone; the checkpoint records the boot, and a stale one never deletes outside the CDI folder.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIMS, COMPUTE_DOMAINS, Rest
from fabricdra.kubeletplugin.computedomain.driver import ComputeDomainDriver, NodeConfig
from fabricdra.kubeletplugin.kubelet import (
    Call,
    ClaimRef,
    PluginPaths,
    PluginServer,
    PrepareError,
)
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint, ClaimEntry
from fabricdra.kubeletplugin.kubelet.driver import serving
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc

from .socketdir import remove_dir, short_dir

NS = "team"
NODE = "gb-1"


class FakeApi:
    """GET <path> answers `docs[path]` (404 without one); paths in `hold` wait for
    `release`; `on_read(path)` runs before each answer."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.held = threading.Event()
        self.reads: dict[str, int] = {}
        self.on_read: Callable[[str], None] = lambda path: None
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                api.reads[path] = api.reads.get(path, 0) + 1
                api.on_read(path)
                if path in api.hold:
                    api.held.set()
                    api.release.wait(60)
                doc = api.docs.get(path)
                body = json.dumps(doc or {"kind": "Status", "message": "not found"}).encode()
                try:
                    self.send_response(200 if doc else 404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up on this read
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # shutdown() returns at the loop's next poll: its default 0.5 s was each test's teardown.
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def domain(self, name: str, uid: str, *, ready: bool | None = None) -> None:
        status: dict[str, Any] = {"channels": [0]}
        if ready is not None:
            status["nodes"] = [{"name": NODE, "ready": ready, "message": "IMEX starting"}]
        self.docs[COMPUTE_DOMAINS.path(NS, name)] = {
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "status": status,
        }

    def claim(self, name: str, uid: str, domain: str, domain_uid: str) -> ClaimRef:
        params = {
            "kind": cd.OPAQUE_KIND,
            "namespace": NS,
            "domainName": domain,
            "domainUID": domain_uid,
            "channel": 0,
        }
        self.docs[CLAIMS.path(NS, name)] = {
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "driver": cd.DRIVER,
                                "pool": NODE,
                                "device": cd.CHANNEL_DEVICE,
                                "request": "channel",
                            }
                        ],
                        "config": [
                            {"opaque": {"driver": cd.DRIVER, "parameters": params}},
                        ],
                    }
                }
            },
        }
        return ClaimRef(NS, name, uid)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[FakeApi]:
    a = FakeApi()
    yield a
    a.close()


def make_driver(base: Path, api: FakeApi, *, fabric: str = "", **kw: Any) -> ComputeDomainDriver:
    proc = base / "proc"
    proc.mkdir(exist_ok=True)
    # No IMEX channel major: a node without a multi-node fabric (env-only specs, no mknod).
    (proc / "devices").write_text("Character devices:\n195 nvidia\n\nBlock devices:\n")
    config = client.Configuration()
    config.host = api.url
    return ComputeDomainDriver(
        Rest(client.ApiClient(config)),
        NodeConfig(
            node_name=NODE,
            cdi_dir=base / "cdi",
            plugin_dir=base / "plugin",
            proc_root=proc,
            dev_root=base / "dev",
            fabric_domain=fabric,
            **kw,
        ),
    )


class Kubelet:
    """The driver behind a real PluginServer, and kubelet's v1 stub for it."""

    def __init__(self, base: Path, driver: ComputeDomainDriver) -> None:
        self.sockets = short_dir()  # not under `base`: a socket's path is short
        self.paths = PluginPaths.for_driver(
            cd.DRIVER, registry_dir=self.sockets / "reg", plugin_dir=self.sockets / "sock"
        )
        self.server = PluginServer(driver, self.paths)
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{self.paths.dra_socket}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)

    @staticmethod
    def _claims(claim: ClaimRef) -> list[Any]:
        return [v1_pb2.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)]

    def prepare_async(self, claim: ClaimRef, timeout: float = 45) -> Any:
        msg = v1_pb2.NodePrepareResourcesRequest(claims=self._claims(claim))
        return self.stub.NodePrepareResources.future(msg, timeout=timeout)

    def prepare(self, claim: ClaimRef, timeout: float = 45) -> Any:
        return self.prepare_async(claim, timeout).result().claims[claim.uid]

    def unprepare(self, claim: ClaimRef, timeout: float = 45) -> Any:
        msg = v1_pb2.NodeUnprepareResourcesRequest(claims=self._claims(claim))
        return self.stub.NodeUnprepareResources(msg, timeout=timeout).claims[claim.uid]

    def close(self) -> None:
        self.channel.close()
        self.server.stop()
        remove_dir(self.sockets)


def specs(base: Path) -> list[str]:
    return sorted(p.name for p in (base / "cdi").glob("*.json"))


def test_a_hung_claim_read_delays_no_other_claim(tmp_path: Path, api: FakeApi) -> None:
    api.domain("d", "d-uid")
    slow = api.claim("slow", "uid-slow", "d", "d-uid")
    fast = api.claim("fast", "uid-fast", "d", "d-uid")
    api.hold.add(CLAIMS.path(NS, "slow"))
    kubelet = Kubelet(tmp_path, make_driver(tmp_path, api))
    try:
        pending = kubelet.prepare_async(slow)
        assert api.held.wait(10)
        # a short deadline: a call queued behind the hung read fails instead of waiting
        assert kubelet.prepare(fast, timeout=10).error == ""
        assert kubelet.unprepare(fast, timeout=10).error == ""
        assert not pending.done()
        api.release.set()
        assert pending.result(timeout=30).claims[slow.uid].error == ""
    finally:
        kubelet.close()


def test_waiting_for_imex_delays_no_unprepare(tmp_path: Path, api: FakeApi) -> None:
    """An unrelated unprepare once waited 7.5 s behind a prepare waiting for IMEX."""
    api.domain("waiting", "w-uid", ready=False)
    waiting = api.claim("waiting", "uid-w", "waiting", "w-uid")
    other = ClaimRef(NS, "other", "uid-other")
    driver = make_driver(tmp_path, api, fabric="rack-1", imex_wait_seconds=30.0)
    kubelet = Kubelet(tmp_path, driver)
    try:
        reads = threading.Event()
        api.on_read = lambda path: reads.set() if path.endswith("/waiting") else None
        pending = kubelet.prepare_async(waiting)
        assert reads.wait(10)
        assert kubelet.unprepare(other, timeout=5).error == ""
        assert not pending.done()
    finally:
        kubelet.close()


def test_the_claim_read_ends_within_kubelets_deadline_in_one_attempt(
    tmp_path: Path, api: FakeApi
) -> None:
    api.domain("d", "d-uid")
    claim = api.claim("stuck", "uid-stuck", "d", "d-uid")
    api.hold.add(CLAIMS.path(NS, "stuck"))
    driver = make_driver(tmp_path, api)
    # kubelet has 7 s left: the read gets at most 7 - 5 s, in one attempt (the held read
    # would be answered only after 60 s)
    with serving(Call(time.monotonic() + 7, lambda: True)), pytest.raises(PrepareError) as e:
        driver.prepare(claim)
    assert "timed out" in str(e.value).lower()
    assert api.reads[CLAIMS.path(NS, "stuck")] == 1
    assert specs(tmp_path) == []


def test_the_imex_wait_stops_when_kubelet_has_gone(tmp_path: Path, api: FakeApi) -> None:
    api.domain("waiting", "w-uid", ready=False)
    claim = api.claim("waiting", "uid-w", "waiting", "w-uid")
    driver = make_driver(
        tmp_path, api, fabric="rack-1", imex_wait_seconds=30.0, imex_poll_seconds=0.1
    )
    kubelet_there = threading.Event()
    kubelet_there.set()
    # kubelet cancels its call once the plugin has looked at the domain twice
    domain = COMPUTE_DOMAINS.path(NS, "waiting")
    api.on_read = lambda path: (
        kubelet_there.clear() if path == domain and api.reads[path] >= 2 else None
    )
    with (
        serving(Call(time.monotonic() + 45, kubelet_there.is_set)),
        pytest.raises(PrepareError, match="kubelet gave up"),
    ):
        driver.prepare(claim)
    assert api.reads[domain] <= 3
    assert driver.checkpoint.get(claim.uid) is None


def test_the_imex_wait_ends_before_kubelets_deadline(tmp_path: Path, api: FakeApi) -> None:
    api.domain("waiting", "w-uid", ready=False)
    claim = api.claim("waiting", "uid-w", "waiting", "w-uid")
    # configured to wait 30 s, but kubelet's call has only 7 s left: the answer (an error
    # saying IMEX is not ready) must come back while kubelet still listens
    driver = make_driver(tmp_path, api, fabric="rack-1", imex_wait_seconds=30.0)
    kubelet = Kubelet(tmp_path, driver)
    try:
        entry = kubelet.prepare(claim, timeout=7)
        assert "is not ready on node" in entry.error
    finally:
        kubelet.close()


def test_the_checkpoint_records_the_boot_and_drops_another_boots_claims(
    tmp_path: Path, api: FakeApi
) -> None:
    api.domain("d", "d-uid")
    claim = api.claim("c", "uid-c", "d", "d-uid")
    driver = make_driver(tmp_path, api, boot_id="boot-1")
    driver.prepare(claim)
    doc = json.loads((tmp_path / "plugin" / "checkpoint.json").read_text())
    assert doc["bootId"] == "boot-1"
    assert specs(tmp_path) == [f"fabricdra.io-compute-domain_{claim.uid}.json"]
    after_reboot = make_driver(tmp_path, api, boot_id="boot-2")
    assert after_reboot.checkpoint.entries() == []
    assert specs(tmp_path) == []


def test_a_stale_checkpoint_never_deletes_outside_the_cdi_folder(
    tmp_path: Path, api: FakeApi
) -> None:
    outside = tmp_path / "precious.json"
    outside.write_text("{}")
    inside = tmp_path / "cdi" / "fabricdra.io-compute-domain_uid-x.json"
    inside.parent.mkdir()
    inside.write_text("{}")
    escape = tmp_path / "cdi" / ".." / "precious2.json"
    (tmp_path / "precious2.json").write_text("{}")
    Checkpoint(tmp_path / "plugin" / "checkpoint.json", boot_id="boot-1").put(
        ClaimEntry("uid-x", NS, "x", (str(outside), str(escape), str(inside)))
    )
    make_driver(tmp_path, api, boot_id="boot-2")
    assert outside.exists()
    assert (tmp_path / "precious2.json").exists()
    assert not inside.exists()
