"""The compute-domain driver answers kubelet in time (issue 29 point 6): no API read under its
lock, every wait bounded by the call's deadline, a repeat prepare answered from the checkpoint.

Over the same real parts as test_computedomain_driver.py (whose helpers these are): a real
HTTP API server on a local port answering the claims, the ComputeDomain and the Node from
documents, holding the reads of chosen paths until released; the driver behind a real
`PluginServer`, kubelet's calls over gRPC on a unix socket with kubelet's own deadlines; CDI
specs, the checkpoint and its lock file on disk; /proc/devices with the IMEX channel major and
a device-node folder. The frozen peer is a real `flock` on the checkpoint's lock file (an agent
pod of a rolling update that stopped while holding it)."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.kube.rest import CLAIMS, NODES
from fabricdra.kubeletplugin.computedomain.driver import ComputeDomainDriver
from fabricdra.kubeletplugin.kubelet import ClaimRef
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from tests.unit.test_computedomain_driver import NODE, NS, FakeApi, Kubelet, make_driver

DOMAIN, DOMAIN_UID = "train", "d-uid"


class Node:
    """The driver on a node of NVLink fabric domain rack-1 (its label, read from the Node),
    behind kubelet's gRPC."""

    def __init__(self, base: Path, api: FakeApi) -> None:
        self.api = api
        # The driver's namespace is the claims' (NS): its IMEX daemon claims are prepared only
        # there (issue 29 point 1), and every claim here is made in NS.
        self.driver: ComputeDomainDriver = make_driver(
            base, api, fabric_from_node=True, imex_wait_seconds=1.0, daemon_namespace=NS
        )
        (base / "proc" / "devices").write_text(
            "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n\nBlock devices:\n"
        )
        api.docs[NODES.path(None, NODE)] = {
            "metadata": {"name": NODE, "labels": {labels.FABRIC_DOMAIN: "rack-1"}}
        }
        api.domain(DOMAIN, DOMAIN_UID, ready=True)
        # Sockets in a short folder: pytest's folder names overrun a unix socket address.
        self.sockets = Path(tempfile.mkdtemp(prefix="cdd-"))
        self.kubelet = Kubelet(self.sockets, self.driver)

    def claim(self, name: str, device: str = cd.CHANNEL_DEVICE) -> ClaimRef:
        ref = self.api.claim(name, f"uid-{name}", DOMAIN, DOMAIN_UID)
        if device == cd.DAEMON_DEVICE:  # an IMEX daemon claim of the same domain
            allocation = self.api.docs[CLAIMS.path(NS, name)]["status"]["allocation"]
            result = allocation["devices"]["results"][0]
            result.update(device=cd.DAEMON_DEVICE, request="daemon")
            params = allocation["devices"]["config"][0]["opaque"]["parameters"]
            params["kind"] = cd.DAEMON_OPAQUE_KIND
            del params["channel"]
        return ref

    def call(self, method: str, *refs: ClaimRef, timeout: float = 45) -> Any:
        """One kubelet call for `refs`, with kubelet's deadline `timeout`."""
        claims = [v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
        if method == "prepare":
            msg: Any = v1_pb2.NodePrepareResourcesRequest(claims=claims)
            return self.kubelet.stub.NodePrepareResources(msg, timeout=timeout).claims
        msg = v1_pb2.NodeUnprepareResourcesRequest(claims=claims)
        return self.kubelet.stub.NodeUnprepareResources(msg, timeout=timeout).claims

    def close(self) -> None:
        self.kubelet.close()
        shutil.rmtree(self.sockets, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    api = FakeApi()
    n = Node(tmp_path, api)
    yield n
    api.close()
    n.close()


def test_a_daemon_claims_api_reads_hold_up_no_other_claim(node: Node) -> None:
    """The node's fabric label (which the daemon's environment carries) is read before the
    driver's lock: while that read hangs, kubelet's calls for other claims go through."""
    other = node.claim("other")
    assert node.call("prepare", other)[other.uid].error == ""
    daemon = node.claim("daemon-0", cd.DAEMON_DEVICE)
    node.api.hold.add(NODES.path(None, NODE))
    pending = node.kubelet.prepare_async(daemon)
    assert node.api.held.wait(30)
    # a short deadline: an unprepare queued behind the hung read would fail, not wait
    assert node.kubelet.unprepare(other, timeout=8).error == ""
    assert not pending.done()
    node.api.release.set()
    assert pending.result(timeout=30).claims[daemon.uid].error == ""


def test_a_frozen_peer_on_the_checkpoint_lock_never_makes_an_answer_late(node: Node) -> None:
    """Another holder of the checkpoint's lock file stopped while holding it. Each claim's
    wait for the lock ends before kubelet's deadline: a call for three claims is answered
    (each claim an error) before kubelet gives up on it, for prepare and unprepare alike. The
    lock's own 10 s per claim answered the unprepare after 30 s."""
    claims = [node.claim(f"c-{i}") for i in range(3)]
    holder = os.open(node.driver.checkpoint.lock_path, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        # A short deadline for these calls (kubelet's own is 45 s; a prepare keeps 5 s of it
        # for its API read), and a wide margin before it (the plugin's own is LOCK_MARGIN,
        # 2 s) so that the first claim waits 1.5 s for the lock, not 4: the lock's own 10 s per
        # claim would miss the deadline three times over.
        node.driver.checkpoint.lock_margin = 4.5
        prepared = node.call("prepare", *claims, timeout=6)
        unprepared = node.call("unprepare", *claims, timeout=6)
    finally:
        os.close(holder)
    # The first claim waited for the lock; the others found too little time left.
    assert "checkpoint.json.lock" in prepared[claims[0].uid].error, prepared
    assert all(prepared[c.uid].error for c in claims), prepared
    for c in claims:
        assert "checkpoint.json.lock" in unprepared[c.uid].error, unprepared
    assert list((node.driver.config.cdi_dir).glob("*.json")) == []
    prepared = node.call("prepare", *claims)  # the peer is gone: the same call succeeds
    assert [prepared[c.uid].error for c in claims] == ["", "", ""]


def test_a_repeat_prepare_is_answered_from_the_checkpoint(node: Node) -> None:
    """kubelet prepares a claim again (after its own restart, or for a pod sharing it): the
    answer is the recorded one, at once, without reading the API or waiting for IMEX — here
    IMEX on the node is restarting (its row not ready) and every API read hangs."""
    claim = node.claim("w-0")
    first = node.call("prepare", claim)[claim.uid]
    assert first.error == ""
    node.api.domain(DOMAIN, DOMAIN_UID, ready=False)  # IMEX restarting on this node
    node.api.hold.update(node.api.docs)
    reads = dict(node.api.reads)
    again = node.call("prepare", claim, timeout=8)[claim.uid]
    assert again.error == ""
    assert again == first
    assert node.api.reads == reads  # nothing read
