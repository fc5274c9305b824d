"""Host IMEX mode installed by the chart, on several real nodes (issue 22 point 9): the
administrator runs IMEX on every host (here the stand-in `nvidia-imex`, one per node, standing
for the host's `nvidia-imex.service` with its command service on a unix socket), and fabricdra's
controller and compute-domain plugins run as the chart's pods, with the image built from this
checkout. A host-mode ComputeDomain's two pods run on two nodes and the domain becomes Ready:
each node's plugin pod asked its own host's IMEX service, through the driver root's
`nvidia-imex-ctl` and the host socket the chart mounts (`computeDomains.hostImex`). Stopping one
host's IMEX service turns that node's row, and the domain, not ready.

The harness's nodes share one machine, so each needs its own host folders (kubelet root, CDI
folder, /dev, /proc, driver root, IMEX socket): one chart value cannot say that. The chart is
installed with placeholders for those paths and its node DaemonSet kept off every node; the
test then creates, per node, a copy of that DaemonSet (the chart's pod spec, unchanged but for
the placeholders replaced by the node's own folders and a node selector for that node only).
The harness has no kube-proxy: the pods use the host network to reach the API server, as in the
single-node install tests (e2e.harness.helm.harness_values).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
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
from e2e.harness.images import fabricdra_image
from e2e.harness.multinode import MultiNodeCluster, WorkerNode
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import COMPUTE_DOMAINS, LEASES, NODES, PODS, Rest
from fabricdra.kubeletplugin.computedomain.report import host_lease_name
from tests.e2e.test_multinode_computedomain import FABRIC, IMEX_MAJOR, Env, _domain, _pod
from tests.integration.computedomain_helpers import condition

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

NAMESPACE = "fabricdra-system"
STAND_INS = Path(__file__).resolve().parents[1] / "imex"
# Placeholders in the chart's values, replaced per node in its copy of the node DaemonSet.
KUBELET_ROOT = "/fdra-per-node-kubelet-root"
CDI_DIR = "/fdra-per-node-cdi"
HOST = "/fdra-per-node-host"
SOCKET = "etc/nvidia-imex/imex_ctrl.sock"  # under each host folder (NVIDIA's default path)
NOWHERE = {"fabricdra.test/chart-node-pods": "per-node-copies"}  # no node has this label


@dataclass
class HostImex:
    """The host's IMEX service of one node (the administrator's, not fabricdra's)."""

    node: WorkerNode
    host: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.host / SOCKET

    def start(self) -> None:
        config = self.host / "etc" / "nvidia-imex" / "config.cfg"
        nodes = config.parent / "nodes_config.cfg"
        nodes.write_text(f"{self.node.ip}\n")
        config.write_text(
            "IMEX_CMD_ENABLED=1\n"
            f"IMEX_CMD_UNIX_DOMAIN_PATH={self.socket}\n"
            f"IMEX_NODE_CONFIG_FILE={nodes}\n"
        )
        log = (self.node.logs_dir / "host-nvidia-imex.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(STAND_INS / "nvidia-imex"), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self.socket.exists, timeout=30, what=f"host IMEX socket {self.socket}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


def _host(base: Path, node: WorkerNode) -> Path:
    """What the NVIDIA driver and the IMEX package give one node: /proc/devices with the IMEX
    channel major, a /dev, the driver root's `nvidia-imex-ctl`, and /etc/nvidia-imex."""
    host = base / str(node.index)
    (host / "proc").mkdir(parents=True)
    (host / "dev").mkdir()
    (host / "proc" / "devices").write_text(
        f"Character devices:\n195 nvidia\n{IMEX_MAJOR} nvidia-caps-imex-channels\n\n"
        "Block devices:\n"
    )
    bin_dir = host / "driver-root" / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("nvidia-imex", "nvidia-imex-ctl"):
        shutil.copy2(STAND_INS / tool, bin_dir / tool)
        (bin_dir / tool).chmod(0o755)
    (host / "etc" / "nvidia-imex").mkdir(parents=True)
    return host


def _values(cluster: MultiNodeCluster, image: str) -> dict[str, Any]:
    repository, _, tag = image.rpartition(":")
    port = str(cluster.server).rsplit(":", 1)[1]
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "gpus": {"enabled": False},
        "rdma": {"enabled": False},
        "kubeletRootDir": KUBELET_ROOT,
        "cdiDir": CDI_DIR,
        "devRoot": f"{HOST}/dev",
        "procRoot": f"{HOST}/proc",
        "driverRoot": f"{HOST}/driver-root",
        "computeDomains": {
            "enabled": True,
            "hostImex": {"enabled": True, "socketPath": f"{HOST}/{SOCKET}"},
        },
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": port},
        ],
        "node": {"hostNetwork": True, "deviceNodeLabels": [], "nodeSelector": NOWHERE},
        "controller": {"hostNetwork": True, "replicas": 1},
        "cleanup": {"hostNetwork": True},
    }


def _per_node_daemonset(chart_ds: dict[str, Any], node: WorkerNode, host: Path) -> dict[str, Any]:
    """The chart's node DaemonSet for this node only, with its own host folders."""
    text = json.dumps(chart_ds)
    for placeholder, path in (
        (KUBELET_ROOT, node.kubelet_root),
        (CDI_DIR, node.cdi_dir),
        (HOST, host),
    ):
        text = text.replace(placeholder, str(path))
    ds: dict[str, Any] = json.loads(text)
    name = f"fabricdra-node-{node.index}"
    ds["metadata"] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": chart_ds["metadata"].get("labels", {}),
    }
    ds.pop("status", None)
    mark = {"fabricdra.test/node": str(node.index)}
    ds["spec"]["selector"]["matchLabels"].update(mark)
    ds["spec"]["template"]["metadata"]["labels"].update(mark)
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.node_name}
    return ds


@dataclass
class Installed:
    env: Env
    hosts: dict[str, HostImex]


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    # Short: the IMEX socket path under it must fit a unix socket's 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="fdra-hi-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def image(base: Path) -> tuple[Path, str]:
    """Built before the cluster starts (requested first): the build does not need the
    machine's node-cluster lock, and overlaps the wait for it."""
    return fabricdra_image(base / "image")


@pytest.fixture(scope="module")
def installed(
    base: Path, image: tuple[Path, str], multi_node_cluster: MultiNodeCluster
) -> Iterator[Installed]:
    cluster = multi_node_cluster
    archive, ref = image
    hosts: dict[str, HostImex] = {}
    try:
        for node in cluster.nodes:
            node.import_images(binaries.bin_dir(), [(archive, ref)])
            hosts[node.node_name] = HostImex(node, _host(base / "hosts", node))
            hosts[node.node_name].start()
        rest = Rest(cluster.api_client())
        for node in cluster.nodes:
            # What the node agent labels on an NVL72 node.
            rest.patch(
                NODES,
                node.node_name,
                {"metadata": {"labels": {"fabricdra.io/fabric.domain": FABRIC}}},
            )
        Chart().install(cluster.kubeconfig, NAMESPACE, values=_values(cluster, ref))
        start_node_plugins(cluster, rest, hosts)
        yield Installed(Env(cluster, rest, {}, base), hosts)
    finally:
        for h in hosts.values():
            h.stop()


def start_node_plugins(cluster: MultiNodeCluster, rest: Rest, hosts: dict[str, HostImex]) -> None:
    """One copy of the chart's node DaemonSet per node (nodes share this machine, so each
    node's host paths differ), then each node's compute-domain plugin labelling its node."""
    with cluster.api_client() as api:
        apps = client.AppsV1Api(api)
        chart_ds = api.sanitize_for_serialization(
            apps.read_namespaced_daemon_set("fabricdra-node", NAMESPACE)
        )
        for node in cluster.nodes:
            apps.create_namespaced_daemon_set(
                NAMESPACE, _per_node_daemonset(chart_ds, node, hosts[node.node_name].host)
            )
    for node in cluster.nodes:
        wait_for(
            lambda node=node: (
                rest.get(NODES, node.node_name)["metadata"]["labels"].get(cd.PLUGIN_NODE_LABEL)
                == "true"
            ),
            timeout=180,
            what=f"the compute-domain plugin pod on {node.node_name} labelling its node",
        )


def _plugin_pods(e: Env) -> dict[str, str]:
    """Node -> phase of the compute-domain plugin pods (the chart's node pods)."""
    pods = e.rest.list(PODS, NAMESPACE, label_selector="app.kubernetes.io/component=node")
    return {
        p["spec"]["nodeName"]: p["status"].get("phase", "")
        for p in pods["items"]
        if any(c["name"] == "compute-domain" for c in p["spec"]["containers"])
    }


def _host_reports(e: Env) -> dict[str, str]:
    out = {}
    for name in e.names:
        lease = e.rest.get_or_none(LEASES, host_lease_name(name), NAMESPACE) or {}
        ann = lease.get("metadata", {}).get("annotations", {})
        out[name] = f"{ann.get(cd.REPORT_READY)}: {ann.get(cd.REPORT_MESSAGE)}"
    return out


def test_host_mode_domain_is_ready_with_the_charts_pods(installed: Installed) -> None:
    e = installed.env
    ns = "hostimex"
    with e.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
    domain = _domain(e, ns, "hosted", num_nodes=2, mode="host")
    template = f"{domain['metadata']['name']}-imex"
    for i in range(2):
        e.rest.create(PODS, _pod(f"w{i}", template, job="hosted"), ns)

    def placed() -> dict[str, str] | None:
        pods = {f"w{i}": e.rest.get(PODS, f"w{i}", ns) for i in range(2)}
        if all(p.get("status", {}).get("phase") == "Running" for p in pods.values()):
            return {k: p["spec"]["nodeName"] for k, p in pods.items()}
        return None

    try:
        nodes = wait_for(
            placed, timeout=180, what=f"both pods Running (host reports: {_host_reports(e)})"
        )
        ready = wait_for(
            lambda: (
                (o := e.rest.get(COMPUTE_DOMAINS, "hosted", ns))
                and (condition(o, cd.READY) or {}).get("status") == "True"
                and o
            ),
            timeout=120,
            what="the host-mode domain Ready",
        )
    except Exception as err:
        raise AssertionError(f"{err}; host IMEX reports: {_host_reports(e)}") from err

    assert len(set(nodes.values())) == 2
    rows = ready["status"]["nodes"]
    assert sorted(r["name"] for r in rows) == sorted(nodes.values())
    assert all(r["ready"] for r in rows)
    daemons = condition(ready, cd.DAEMONS_READY) or {}
    assert (daemons.get("status"), daemons.get("reason")) == ("True", "HostManaged")
    # The plugins are the chart's pods, one per node, and each asked its own host's service.
    assert _plugin_pods(e) == dict.fromkeys(e.names, "Running")
    reports = _host_reports(e)
    assert all(r == "true: host IMEX service READY" for r in reports.values()), reports

    # One host's IMEX service stops: that node's plugin pod says so, its row turns not ready.
    down = sorted(nodes.values())[0]
    installed.hosts[down].stop()
    degraded = wait_for(
        lambda: (
            (o := e.rest.get(COMPUTE_DOMAINS, "hosted", ns))
            and (condition(o, cd.READY) or {}).get("status") == "False"
            and o
        ),
        timeout=120,
        what=f"the domain not Ready once {down}'s host IMEX stopped",
    )
    row = next(r for r in degraded["status"]["nodes"] if r["name"] == down)
    assert row["ready"] is False
    assert "host IMEX" in row.get("message", ""), row
    others = [r for r in degraded["status"]["nodes"] if r["name"] != down]
    assert [r["ready"] for r in others] == [True]
