"""The multi-node NVLink check in the cluster (issue 18 point 4): the ComputeDomain controller,
installed by the chart with its own RBAC and `verification.activeProbes` (so `--fabric-check`,
`--fabric-check-image`, host IMEX mode), runs the check over the three real kubelet nodes of
one fabric domain with the verification image of the stand-ins (tests/standins: sshd is
OpenSSH's, mpirun and nvbandwidth-multinode are the stand-ins):

- its worker pods run on their nodes (each allocated the check's own ComputeDomain channel
  through the real compute-domain plugins, as test_multinode_install_hostimex.py installs
  them), the launcher pod runs once they do, the stand-in mpirun connects to every worker's
  sshd (it fails, as mpirun does, when one does not answer: so the run proves the launcher
  reaches the workers across nodes, named through the launcher's hostAliases), and the
  controller parses the stand-in nvbandwidth's output from the launcher's log;
- first from an image whose environment makes one cross-node GPU pair weak
  (STANDIN_D2D_WEAK, the stand-in's knob: the product sets no environment of its own on the
  launcher, so the knob rides in the image, `verification.image`): no node gets
  `fabricdra.io/fabric-verified`, each checked node gets the failed record and a
  `FabricCheckFailed` Event names the pair;
- then, the chart upgraded to the plain image, the check runs again and passes: every node
  gets the label and the passed record, the check's objects are gone, and a ComputeDomain of
  2 is placed in the domain.

The nodes' GPUs and per-node verification are written by the test as the integration tests do
(the harness has no GPUs; the chart's GPU plugin is off): 4 GB200 GPUs in each node's
ResourceSlice, NodeDevices `Verified`, the `fabricdra.io/verified` label.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness import binaries
from e2e.harness.controlplane import wait_for
from e2e.harness.helm import Chart
from e2e.harness.images import fabricdra_image, verification_image
from e2e.harness.multinode import MultiNodeCluster
from e2e.harness.ociarchive import with_env
from fabricdra.api import labels
from fabricdra.api.fabriccheck import record_of
from fabricdra.controller.fabriccheckrun import RUN_LABEL
from fabricdra.kube.rest import COMPUTE_DOMAINS, EVENTS, NODE_DEVICES, NODES, PODS, SLICES, Rest
from tests.e2e.test_multinode_computedomain import FABRIC, Env, _domain
from tests.e2e.test_multinode_install_hostimex import (
    NAMESPACE,
    HostImex,
    _host,
    _values,
    start_node_plugins,
)
from tests.fleetdata import GB200, _gpu, _slice

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

STANDINS = Path(__file__).resolve().parents[1] / "standins"
GPUS = 4
WEAK = "1:6:41.20"  # rank 1 (the first node's GPU 1) -> rank 6 (the second node's GPU 2)
CHECK_TIMEOUT = 420.0  # image start, IMEX, sshd, the run; the controller polls every 5 s


@dataclass
class Images:
    product: tuple[Path, str]
    verify: tuple[Path, str]
    weak: tuple[Path, str]


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    # Short: the IMEX socket path under it must fit a unix socket's 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="fdra-fc-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def images(base: Path) -> Images:
    """Built before the cluster starts (requested first): the builds do not need the
    machine's node-cluster lock."""
    product = fabricdra_image(base / "image")
    archive, ref = verification_image(base / "verify", STANDINS)
    weak_ref = ref.rpartition(":")[0] + ":e2e-weak"
    weak = with_env(archive, base / "verify-weak.tar", weak_ref, {"STANDIN_D2D_WEAK": WEAK})
    return Images(product, (archive, ref), (weak, weak_ref))


def _publish(rest: Rest, node: str) -> None:
    """What the node agent publishes for an NVL72 tray that passed its per-node gate."""
    rest.patch(
        NODES,
        node,
        {"metadata": {"labels": {"fabricdra.io/fabric.domain": FABRIC, labels.VERIFIED: "true"}}},
    )
    rest.create(SLICES, _slice(node, [_gpu(i, GB200, FABRIC, []) for i in range(GPUS)]))
    body = {"apiVersion": "fabricdra.io/v1alpha1", "kind": "NodeDevices"}
    rest.create(NODE_DEVICES, {**body, "metadata": {"name": node}, "spec": {}})
    verification = {"state": "Verified", "reason": "passed", "currentFingerprint": f"hw-{node}"}
    rest.patch(NODE_DEVICES, node, {"status": {"verification": verification}}, sub="status")


def _chart_values(cluster: MultiNodeCluster, images: Images, image: str) -> dict[str, Any]:
    """The chart with the check on (`activeProbes`: `--fabric-check=true`) from `image`;
    empty: off."""
    values = _values(cluster, images.product[1])
    # The harness's nodes publish their GPUs and verification from this test, not from a
    # devices plugin (gpus.enabled=false here), so the check is required outright.
    values["verification"] = {
        "activeProbes": bool(image),
        "image": image,
        "fabricCheck": {"required": bool(image)},
    }
    return values


@dataclass
class Installed:
    env: Env
    images: Images
    hosts: dict[str, HostImex]


@pytest.fixture(scope="module")
def installed(
    base: Path, images: Images, multi_node_cluster: MultiNodeCluster
) -> Iterator[Installed]:
    cluster = multi_node_cluster
    # The launcher reaches the workers on the other nodes through the host (the harness routes
    # its pods' network between the nodes' bridges): the host must forward.
    if Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != "1":
        pytest.fail("net.ipv4.ip_forward is off: pods on different nodes cannot talk")
    hosts: dict[str, HostImex] = {}
    try:
        for node in cluster.nodes:
            node.import_images(binaries.bin_dir(), [images.product, images.verify, images.weak])
            hosts[node.node_name] = HostImex(node, _host(base / "hosts", node))
            hosts[node.node_name].start()
        rest = Rest(cluster.api_client())
        # The check off first: the chart brings the NodeDevices CRD, and the nodes, published
        # one after the other, must not be checked in part (a check of two nodes, then three).
        Chart().install(cluster.kubeconfig, NAMESPACE, values=_chart_values(cluster, images, ""))
        for node in cluster.nodes:
            _publish(rest, node.node_name)
        start_node_plugins(cluster, rest, hosts)
        # Now the check, from the weak image (the first phase of the test).
        Chart().install(
            cluster.kubeconfig, NAMESPACE, values=_chart_values(cluster, images, images.weak[1])
        )
        yield Installed(Env(cluster, rest, {}, base), images, hosts)
    finally:
        for h in hosts.values():
            h.stop()


def _fabric_label(e: Env, node: str) -> str | None:
    value = e.rest.get(NODES, node)["metadata"].get("labels", {}).get(labels.FABRIC_VERIFIED)
    return None if value is None else str(value)


def _events(e: Env, reason: str) -> list[dict[str, Any]]:
    items = e.rest.list(EVENTS, "default").get("items", [])
    return [i for i in items if i.get("reason") == reason]


def _check_objects(e: Env) -> list[str]:
    out = []
    for kind in (COMPUTE_DOMAINS, PODS):
        for obj in e.rest.list(kind, NAMESPACE, label_selector=RUN_LABEL)["items"]:
            out.append(f"{kind.plural}/{obj['metadata']['name']}")
    return out


def _controller_log(e: Env) -> str:
    with e.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=controller"
        ).items
        out = []
        for pod in pods:
            with contextlib.suppress(client.ApiException):
                log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
                out.append("\n".join(log.splitlines()[-40:]))
        return "\n".join(out)


class _Seen:
    """The check's pods as the test saw them while they ran (the controller deletes them)."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}

    def look(self, e: Env) -> None:
        for pod in e.rest.list(PODS, NAMESPACE, label_selector=RUN_LABEL)["items"]:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Running", "Succeeded", "Failed") or pod["metadata"]["name"] not in (
                self.pods
            ):
                self.pods[pod["metadata"]["name"]] = pod

    def roles(self) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for pod in self.pods.values():
            role = pod["metadata"]["labels"].get("fabricdra.io/fabric-check-role", "")
            node = pod["spec"].get("nodeName", "")
            out.setdefault(role, []).append((node, (pod.get("status") or {}).get("phase", "")))
        return out


def _until(e: Env, seen: _Seen, done: Any, what: str) -> Any:
    def poll() -> Any:
        seen.look(e)
        return done()

    try:
        return wait_for(poll, timeout=CHECK_TIMEOUT, interval=1.0, what=what)
    except Exception as err:
        raise AssertionError(
            f"{err}\ncheck pods seen: {seen.roles()}\ncontroller:\n{_controller_log(e)}"
        ) from err


def test_the_controller_runs_the_check_in_the_cluster_and_opens_the_domain(
    installed: Installed,
) -> None:
    e = installed.env
    names = sorted(e.names)

    # 1. The weak image: one cross-node pair below the floor.
    seen = _Seen()
    failed = _until(e, seen, lambda: _events(e, "FabricCheckFailed"), "a FabricCheckFailed event")
    first = record_of(e.rest.get(NODES, names[0]))
    assert first is not None
    assert sorted(first.nodes) == names
    ranked = first.nodes  # the check's order: rank r is GPU r % 4 of node r // 4
    pair = f"{ranked[0]}/GPU 1 -> {ranked[1]}/GPU 2: 41.20 GB/s, below 335 GB/s"
    assert any(pair in ev["message"] for ev in failed), [ev["message"] for ev in failed]
    assert {ev["involvedObject"]["name"] for ev in failed} <= {ranked[0], ranked[1]}
    roles = seen.roles()
    # One worker per node, each seen running on its node.
    assert sorted(n for n, _ in roles["worker"]) == names, roles
    assert all(phase in ("Running", "Succeeded", "Failed") for _, phase in roles["worker"])
    # The launcher ran (its log parsed is what made the Event); the controller deletes it
    # within its 5 s poll of the end, so the test may last have seen it Running.
    assert [phase in ("Running", "Succeeded") for _, phase in roles["launcher"]] == [True], roles
    for node in names:
        assert _fabric_label(e, node) is None
        record = record_of(e.rest.get(NODES, node))
        assert record is not None
        assert not record.passed
    wait_for(lambda: _check_objects(e) == [], timeout=60, what="the check's objects deleted")

    # 2. The plain image (a chart upgrade: a new controller): the check passes.
    Chart().install(
        e.cluster.kubeconfig,
        NAMESPACE,
        values=_chart_values(e.cluster, installed.images, installed.images.verify[1]),
    )
    seen = _Seen()
    _until(
        e,
        seen,
        lambda: all(_fabric_label(e, n) == "true" for n in names),
        "every node labelled fabric-verified",
    )
    for node in names:
        record = record_of(e.rest.get(NODES, node))
        assert record is not None
        assert record.passed
        assert sorted(record.nodes) == names
        assert record.minGBs == 797.95  # the stand-in's healthy cross-node figure
    wait_for(lambda: _check_objects(e) == [], timeout=60, what="the check's objects deleted")

    # 3. A ComputeDomain of 2 is placed in the now verified fabric domain.
    ns = "fabric-gang"
    with e.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": ns}})
    _domain(e, ns, "gang", num_nodes=2, mode="host")
    placed = wait_for(
        lambda: e.rest.get(COMPUTE_DOMAINS, "gang", ns).get("status", {}).get("fabricDomain"),
        timeout=120,
        what="the ComputeDomain of 2 placed",
    )
    assert placed == FABRIC
