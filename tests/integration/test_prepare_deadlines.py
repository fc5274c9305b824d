"""Prepare never stalls kubelet: claims are read outside the driver's lock, in one attempt,
within a budget below kubelet's deadline, and a call kubelet gave up on writes nothing.

The API server here is a real HTTP server on a local port that answers claim reads from
documents the test gives it, and holds the reads of chosen claims until the test releases
them (what a stalled API server or a dropped connection looks like to the plugin). Everything
else is real: the devices driver behind a PluginServer, gRPC over a unix socket, CDI specs and
the checkpoint on disk, a 16-HCA kernel-shaped sysfs node."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from fabricdra.kubeletplugin import metrics
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import PluginPaths, PluginServer
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, ApiClaimReader, DevicesDriver
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from tests.integration.kubelethost import DRIVER, RdmaHost, build_rdma_host

pytestmark = pytest.mark.integration

NS = "team"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/"


class StallingApi:
    """Answers GET <claims>/<name> from `docs`; names in `hold` wait for `release`."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.reads: dict[str, int] = {}
        self.held = threading.Event()  # a held read has arrived
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                name = self.path.split("?")[0].removeprefix(CLAIMS)
                api.reads[name] = api.reads.get(name, 0) + 1
                if name in api.hold:
                    api.held.set()
                    api.release.wait(60)
                doc = api.docs.get(name)
                body = json.dumps(doc or {"kind": "Status", "message": "not found"}).encode()
                try:
                    self.send_response(200 if doc else 404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up on this read
                    pass

            def do_POST(self) -> None:  # events
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(201)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def claim(self, name: str, uid: str, device: str) -> tuple[str, str, str]:
        result = {"driver": DRIVER, "request": "nic", "device": device, "pool": "node-a"}
        self.docs[name] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
        return (NS, name, uid)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stalling_api() -> Iterator[StallingApi]:
    api = StallingApi()
    yield api
    api.close()


@pytest.fixture(scope="module")
def rdma_host(tmp_path_factory: pytest.TempPathFactory) -> RdmaHost:
    return build_rdma_host(tmp_path_factory.mktemp("h16"), hcas=16)


class Node:
    def __init__(self, base: Path, host: RdmaHost, api: StallingApi) -> None:
        from kubernetes import client

        config = client.Configuration()
        config.host = api.url
        self.api_client = client.ApiClient(config)
        reader = ApiClaimReader(self.api_client)
        self.cdi_dir = base / "cdi"
        self.driver = DevicesDriver(
            node_name="node-a",
            inventory=host.inventory,
            claims=reader,
            events=reader,
            cdi=CdiWriter(self.cdi_dir, CDI_KIND),
            checkpoint=Checkpoint(base / "checkpoint.json", boot_id="b"),
            host=host.layout,
            families=(NvidiaClaims(ToolkitSpecs(())),),
        )
        self.paths = PluginPaths.for_driver(
            DRIVER, registry_dir=base / "registry", plugin_dir=base / "plugin"
        )
        self.server = PluginServer(self.driver, self.paths, metrics=metrics.claim_metrics())
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{self.paths.dra_socket}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)

    def request(self, *claims: tuple[str, str, str]) -> list[Any]:
        return [v1_pb2.Claim(namespace=n, name=c, uid=u) for n, c, u in claims]

    def prepare(self, claim: tuple[str, str, str], timeout: float = 45) -> Any:
        msg = v1_pb2.NodePrepareResourcesRequest(claims=self.request(claim))
        return self.stub.NodePrepareResources(msg, timeout=timeout).claims[claim[2]]

    def prepare_async(self, claim: tuple[str, str, str], timeout: float = 45) -> Any:
        msg = v1_pb2.NodePrepareResourcesRequest(claims=self.request(claim))
        return self.stub.NodePrepareResources.future(msg, timeout=timeout)

    def unprepare(self, claim: tuple[str, str, str], timeout: float = 45) -> Any:
        msg = v1_pb2.NodeUnprepareResourcesRequest(claims=self.request(claim))
        return self.stub.NodeUnprepareResources(msg, timeout=timeout).claims[claim[2]]

    def specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json"))

    def close(self) -> None:
        self.channel.close()
        self.server.stop()


@pytest.fixture
def node(tmp_path: Path, rdma_host: RdmaHost, stalling_api: StallingApi) -> Iterator[Node]:
    n = Node(tmp_path, rdma_host, stalling_api)
    yield n
    stalling_api.release.set()
    n.close()


def _prepares_finished() -> float:
    value = metrics.REGISTRY.get_sample_value("fabricdra_prepare_seconds_count", {"driver": DRIVER})
    return value or 0.0


def test_a_hung_claim_read_delays_no_other_claim(
    node: Node, stalling_api: StallingApi, rdma_host: RdmaHost
) -> None:
    slow = stalling_api.claim(
        "slow", "00000000-0000-0000-0000-00000000000a", rdma_host.device("mlx5_1")
    )
    fast = stalling_api.claim(
        "fast", "00000000-0000-0000-0000-00000000000b", rdma_host.device("mlx5_2")
    )
    stalling_api.hold.add("slow")
    pending = node.prepare_async(slow)
    assert stalling_api.held.wait(10)
    # kubelet's calls for other claims go through while that read hangs (a short deadline:
    # a call queued behind the hung read fails instead of waiting for it)
    assert node.prepare(fast, timeout=10).error == ""
    assert node.unprepare(fast, timeout=10).error == ""
    assert not pending.done()
    stalling_api.release.set()
    assert pending.result(timeout=30).claims[slow[2]].error == ""


def test_the_read_ends_within_kubelets_deadline_in_one_attempt(
    node: Node, stalling_api: StallingApi, rdma_host: RdmaHost
) -> None:
    claim = stalling_api.claim(
        "stuck", "00000000-0000-0000-0000-00000000000c", rdma_host.device("mlx5_3")
    )
    stalling_api.hold.add("stuck")
    # kubelet would wait 45 s; with 8 s left the read gets 8 - 5 s, and kubelet gets an answer
    entry = node.prepare(claim, timeout=8)
    assert "cannot read the ResourceClaim" in entry.error
    assert "timed out" in entry.error.lower()
    assert stalling_api.reads["stuck"] == 1  # no hidden retries
    assert node.specs() == []


def test_a_call_kubelet_gave_up_on_prepares_nothing(
    node: Node, stalling_api: StallingApi, rdma_host: RdmaHost
) -> None:
    claim = stalling_api.claim(
        "gone", "00000000-0000-0000-0000-00000000000d", rdma_host.device("mlx5_4")
    )
    stalling_api.hold.add("gone")
    finished = _prepares_finished()
    pending = node.prepare_async(claim)
    assert stalling_api.held.wait(10)
    pending.cancel()  # kubelet's context is gone (pod deleted, kubelet restarted...)
    # gRPC hands the cancellation to the server's call asynchronously: let it arrive before the
    # read returns. What is tested is the handler once the call is cancelled, not how fast the
    # transport says so (a loaded CI machine once released the read first: the handler, still
    # seeing an active call, wrote its spec).
    time.sleep(1.0)
    stalling_api.release.set()
    # the handler goes on until its read returns; then it must stop before writing
    for _ in range(300):
        if _prepares_finished() > finished:
            break
        time.sleep(0.1)
    assert _prepares_finished() > finished, "the cancelled prepare never finished"
    assert node.specs() == []
    assert node.driver.checkpoint.get(claim[2]) is None
