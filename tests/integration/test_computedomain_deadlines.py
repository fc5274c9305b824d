"""The compute-domain driver answers kubelet in time (issue 29 point 6): no API read under its
lock, every wait bounded by the call's deadline, a repeat prepare answered from the checkpoint.

The API server is a real HTTP server on a local port that answers GETs of the claims, the
ComputeDomain and the Node from documents the test gives it, and holds the reads of chosen
paths until the test releases them. Everything else is real: `ComputeDomainDriver` behind a
`PluginServer`, kubelet's calls over gRPC on a unix socket with kubelet's own deadlines, CDI
specs, the checkpoint and its lock file on disk, a device node folder and /proc/devices. The
frozen peer is a real `flock` on the checkpoint's lock file (an agent pod of a rolling update
that stopped while holding it)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.kube.rest import CLAIMS, COMPUTE_DOMAINS, NODES, Rest
from fabricdra.kubeletplugin.computedomain.driver import ComputeDomainDriver, NodeConfig
from fabricdra.kubeletplugin.kubelet import PluginPaths, PluginServer
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc

pytestmark = pytest.mark.integration

NS, NODE, DOMAIN = "team", "gb-1", "train"
DOMAIN_UID = "5a1c0c1e-0000-4000-8000-000000000001"
MAJOR = 234


class DocsApi:
    """Answers GET <path> from `docs` (404 otherwise); paths in `hold` wait for `release`."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.held = threading.Event()  # a held read has arrived
        self.reads: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                api.reads.append(path)
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
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def claim_doc(name: str, device: str) -> tuple[str, dict[str, Any]]:
    """A claim allocated on NODE as the controller's templates make them: one result of
    `device` (channel or daemon) with the domain's opaque configuration."""
    uid = str(uuid.uuid4())
    common = {"domainUID": DOMAIN_UID, "domainName": DOMAIN, "namespace": NS}
    if device == cd.CHANNEL_DEVICE:
        params = {"kind": cd.OPAQUE_KIND, "channel": 3, **common}
    else:
        params = {"kind": cd.DAEMON_OPAQUE_KIND, **common}
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": cd.DRIVER, "pool": NODE, "device": device, "request": device}
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": [device],
                            "opaque": {"driver": cd.DRIVER, "parameters": params},
                        }
                    ],
                }
            }
        },
    }
    return uid, doc


class Plugin:
    def __init__(self, base: Path, api: DocsApi) -> None:
        from kubernetes import client

        self.api = api
        proc, dev = base / "proc", base / "dev"
        proc.mkdir()
        (proc / "devices").write_text(
            f"Character devices:\n195 nvidia\n{MAJOR} nvidia-caps-imex-channels\n\nBlock devices:\n"
        )
        conf = client.Configuration()
        conf.host = api.url
        self.driver = ComputeDomainDriver(
            Rest(client.ApiClient(conf)),
            NodeConfig(
                node_name=NODE,
                cdi_dir=base / "cdi",
                plugin_dir=base / "plugin",
                proc_root=proc,
                dev_root=dev,
                fabric_from_node=True,
                imex_wait_seconds=1.0,
                driver_root=base / "driver",
            ),
        )
        api.docs[NODES.path(None, NODE)] = {
            "metadata": {"name": NODE, "labels": {labels.FABRIC_DOMAIN: "rack-1"}}
        }
        self.domain(ready=True)
        # Sockets in a short folder: pytest's names overrun a unix socket address.
        self.sockets = Path(tempfile.mkdtemp(prefix="cdd-"))
        self.paths = PluginPaths.for_driver(
            cd.DRIVER, registry_dir=self.sockets / "r", plugin_dir=self.sockets / "p"
        )
        self.server = PluginServer(self.driver, self.paths)
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{self.paths.dra_socket}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)

    def domain(self, *, ready: bool) -> None:
        """The domain holds channel 3; this node's IMEX is READY or not (restarting)."""
        self.api.docs[COMPUTE_DOMAINS.path(NS, DOMAIN)] = {
            "metadata": {"name": DOMAIN, "namespace": NS, "uid": DOMAIN_UID},
            "status": {
                "channels": [3],
                "nodes": [{"name": NODE, "ready": ready, "message": "" if ready else "RESTARTING"}],
            },
        }

    def claim(self, name: str, device: str) -> v1_pb2.Claim:
        uid, doc = claim_doc(name, device)
        self.api.docs[CLAIMS.path(NS, name)] = doc
        return v1_pb2.Claim(namespace=NS, name=name, uid=uid)

    def prepare(self, *claims: v1_pb2.Claim, timeout: float = 45) -> Any:
        msg = v1_pb2.NodePrepareResourcesRequest(claims=list(claims))
        return self.stub.NodePrepareResources(msg, timeout=timeout).claims

    def unprepare(self, *claims: v1_pb2.Claim, timeout: float = 45) -> Any:
        msg = v1_pb2.NodeUnprepareResourcesRequest(claims=list(claims))
        return self.stub.NodeUnprepareResources(msg, timeout=timeout).claims

    def close(self) -> None:
        self.channel.close()
        self.server.stop()
        shutil.rmtree(self.sockets, ignore_errors=True)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Plugin]:
    api = DocsApi()
    p = Plugin(tmp_path, api)
    yield p
    api.close()
    p.close()


def test_a_daemon_claims_api_reads_hold_up_no_other_claim(plugin: Plugin) -> None:
    """The node's fabric label (which the daemon's environment carries) is read before the
    driver's lock: while that read hangs, kubelet's calls for other claims go through."""
    other = plugin.claim("other", cd.CHANNEL_DEVICE)
    assert plugin.prepare(other)[other.uid].error == ""
    daemon = plugin.claim("daemon-0", cd.DAEMON_DEVICE)
    plugin.api.hold.add(NODES.path(None, NODE))
    msg = v1_pb2.NodePrepareResourcesRequest(claims=[daemon])
    pending = plugin.stub.NodePrepareResources.future(msg, timeout=45)
    assert plugin.api.held.wait(30)
    # a short deadline: an unprepare queued behind the hung read would fail, not wait
    assert plugin.unprepare(other, timeout=8)[other.uid].error == ""
    assert not pending.done()
    plugin.api.release.set()
    assert pending.result(timeout=30).claims[daemon.uid].error == ""


def test_a_frozen_peer_on_the_checkpoint_lock_never_makes_an_answer_late(
    plugin: Plugin,
) -> None:
    """Another holder of the checkpoint's lock file stopped while holding it. Each claim's
    wait for the lock ends before kubelet's deadline runs out: a call for three claims is
    answered (each claim an error naming the lock) before kubelet gives up on it, for prepare
    and for unprepare alike. The lock's own 10 s per claim would have answered after 30 s."""
    claims = [plugin.claim(f"c-{i}", cd.CHANNEL_DEVICE) for i in range(3)]
    holder = os.open(plugin.driver.checkpoint.lock_path, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        # 12 s: kubelet's deadline here (its own is 45 s, for more claims).
        prepared = plugin.prepare(*claims, timeout=12)
        unprepared = plugin.unprepare(*claims, timeout=12)
    finally:
        os.close(holder)
    # The first claim waited for the lock; the others found too little time left.
    assert "checkpoint.json.lock" in prepared[claims[0].uid].error, prepared
    assert all(prepared[c.uid].error for c in claims), prepared
    for c in claims:
        assert "checkpoint.json.lock" in unprepared[c.uid].error, unprepared[c.uid].error
    assert list((plugin.driver.config.cdi_dir).glob("*.json")) == []
    # the peer is gone: the same calls succeed
    prepared = plugin.prepare(*claims)
    assert [prepared[c.uid].error for c in claims] == ["", "", ""]


def test_a_repeat_prepare_is_answered_from_the_checkpoint(plugin: Plugin) -> None:
    """kubelet prepares a claim again (after its own restart, or for a pod sharing it): the
    answer is the recorded one, at once, without reading the API or waiting for IMEX — here
    IMEX on the node is restarting (its row not ready) and the API server hangs."""
    claim = plugin.claim("w-0", cd.CHANNEL_DEVICE)
    first = plugin.prepare(claim)[claim.uid]
    assert first.error == ""
    plugin.domain(ready=False)  # IMEX restarting on this node
    plugin.api.hold.update(plugin.api.docs)  # and every read hangs
    reads = len(plugin.api.reads)
    again = plugin.prepare(claim, timeout=8)[claim.uid]
    assert again.error == ""
    assert again == first
    assert len(plugin.api.reads) == reads  # nothing read
