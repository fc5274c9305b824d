"""Managed-mode IMEX daemons in the cluster, across nodes of one NVLink fabric (issue 29 point
12): the chart installed with host IMEX off, so the controller runs one IMEX daemon pod per
node a ComputeDomain holds (its DaemonSet: host network, the product image built from this
checkout, `fabricdra imex-daemon`), each prepared by its own node's compute-domain plugin pod
(the domain's `/imexd` folder and the driver root's IMEX tools: here the stand-ins of
tests/imex). An elastic managed domain takes one node, then a second:

- each daemon pod writes its clique's peers into its own `/etc/hosts` (kubelet's per-pod copy,
  read here from the node's kubelet folder): the first lists itself, then both nodes once the
  second joined;
- the join signals the running IMEX (SIGUSR1): the stand-in `nvidia-imex` counts the reloads
  and, on each, re-resolves its peer names through the pod's resolver (so through that
  `/etc/hosts`) into its state file (FAKE_IMEX_STATE_FILE, set through the chart's
  `extraEnv`, in the domain's `/imexd` folder on the node);
- both workload pods run and the domain is Ready with its daemons ready.

Nodes share this machine, so each has its own host folders (test_multinode_install_hostimex.py:
one copy of the chart's node DaemonSet per node); each daemon binds IMEX's command port on its
own node's address (IMEX_CMD_BIND_INTERFACE_IP, the pod IP).
"""

from __future__ import annotations

import contextlib
import json
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
from e2e.harness.images import fabricdra_image
from e2e.harness.multinode import MultiNodeCluster, WorkerNode
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import COMPUTE_DOMAINS, NODES, PODS, Rest
from fabricdra.kubeletplugin.computedomain.imex import HOSTS_BEGIN, HOSTS_END
from tests.e2e.test_multinode_computedomain import FABRIC, IMEX_MAJOR, Env, _domain, _pod
from tests.e2e.test_multinode_install_hostimex import (
    NAMESPACE,
    HostImex,
    _host,
    _values,
    start_node_plugins,
)
from tests.integration.computedomain_helpers import condition
from tests.integration.kubelethost import CAPS_MAJOR, mknod

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

STATE = "imex-state.json"  # the stand-in IMEX's state, in the domain's /imexd folder
CAP_MINOR = 1


@dataclass
class Installed:
    env: Env
    nodes: dict[str, WorkerNode]


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="fdra-mi-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def image(base: Path) -> tuple[Path, str]:
    """Built before the cluster starts (requested first): no node-cluster lock needed."""
    return fabricdra_image(base / "image")


def _managed_host(base: Path, node: WorkerNode) -> Path:
    """The node's driver as managed IMEX needs it: the host-mode layout (/proc/devices, /dev,
    the driver root's IMEX stand-ins) and the fabric-imex-mgmt capability the daemon's claim
    hands over (its proc file and device node), as the NVIDIA driver lays them out."""
    host = _host(base, node)
    (host / "proc" / "devices").write_text(
        f"Character devices:\n195 nvidia\n{IMEX_MAJOR} nvidia-caps-imex-channels\n"
        f"{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n"
    )
    cap = host / "proc" / "driver" / "nvidia" / "capabilities" / "fabric-imex-mgmt"
    cap.parent.mkdir(parents=True)
    cap.write_text(f"DeviceFileMinor: {CAP_MINOR}\nDeviceFileMode: 256\n")
    mknod(host / "dev" / "nvidia-caps" / f"nvidia-cap{CAP_MINOR}", CAPS_MAJOR, CAP_MINOR)
    return host


@pytest.fixture(scope="module")
def installed(
    base: Path, image: tuple[Path, str], multi_node_cluster: MultiNodeCluster
) -> Installed:
    cluster = multi_node_cluster
    archive, ref = image
    hosts: dict[str, HostImex] = {}
    for node in cluster.nodes:
        node.import_images(binaries.bin_dir(), [(archive, ref)])
        hosts[node.node_name] = HostImex(node, _managed_host(base / "hosts", node))
    env = Env(cluster, Rest(cluster.api_client()), {}, base)
    for node in cluster.nodes:
        env.rest.patch(
            NODES, node.node_name, {"metadata": {"labels": {"fabricdra.io/fabric.domain": FABRIC}}}
        )
    values = _values(cluster, ref)
    values["computeDomains"] = {"enabled": True, "hostImex": {"enabled": False}}
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "FAKE_IMEX_STATE_FILE", "value": f"/imexd/{STATE}"},
    ]
    Chart().install(cluster.kubeconfig, NAMESPACE, values=values)
    start_node_plugins(cluster, env.rest, hosts)
    return Installed(env, {n.node_name: n for n in cluster.nodes})


def _daemon_pods(e: Env, uid: str) -> dict[str, dict[str, Any]]:
    """Node -> the domain's IMEX daemon pod there."""
    pods = e.rest.list(PODS, NAMESPACE, label_selector=f"{cd.DOMAIN_LABEL}={uid}")["items"]
    return {p["spec"]["nodeName"]: p for p in pods if p["spec"].get("nodeName")}


def _hosts_block(node: WorkerNode, pod: dict[str, Any]) -> list[str] | None:
    """The peers block the daemon wrote into its pod's /etc/hosts (kubelet's per-pod copy on
    the node), None before it wrote one."""
    path = node.kubelet_root / "pods" / pod["metadata"]["uid"] / "etc-hosts"
    with contextlib.suppress(OSError):
        lines = path.read_text().splitlines()
        if HOSTS_BEGIN in lines and HOSTS_END in lines:
            return lines[lines.index(HOSTS_BEGIN) + 1 : lines.index(HOSTS_END)]
    return None


def _imex_state(node: WorkerNode, uid: str) -> dict[str, Any] | None:
    """What the node's stand-in IMEX last published (pid, reloads, its peers resolved)."""
    for path in node.kubelet_root.glob(f"plugins/*/domains/{uid}/{STATE}"):
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(path.read_text()))
    return None


def _running(e: Env, ns: str, pod: str) -> bool:
    return bool(e.rest.get(PODS, pod, ns).get("status", {}).get("phase") == "Running")


def test_managed_daemons_write_their_peers_and_a_join_signals_imex(installed: Installed) -> None:
    e = installed.env
    ns = "managed-imex"
    with e.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
    domain = _domain(e, ns, "managed", mode="managed")  # elastic: nodes join one by one
    uid = domain["metadata"]["uid"]
    first, second = sorted(e.names)[:2]
    a, b = installed.nodes[first], installed.nodes[second]

    def why() -> str:
        obj = e.rest.get(COMPUTE_DOMAINS, "managed", ns)
        pods = {n: p.get("status", {}).get("phase") for n, p in _daemon_pods(e, uid).items()}
        return f"daemon pods {pods}; status {json.dumps(obj.get('status', {}))[:1500]}"

    # 1. The first node: its daemon runs, lists itself, and the workload pod runs.
    e.rest.create(PODS, _pod("w0", "managed-imex", node=first), ns)
    try:
        wait_for(lambda: _running(e, ns, "w0"), timeout=240, what="w0 running on the first node")
        only = wait_for(
            lambda: (p := _daemon_pods(e, uid).get(first)) and _hosts_block(a, p),
            timeout=60,
            what="the first daemon's hosts block",
        )
    except AssertionError as err:
        raise AssertionError(f"{err}; {why()}") from err
    assert [line.split("\t")[0] for line in only] == [a.ip], only
    state = _imex_state(a, uid)
    assert state is not None
    assert sorted(v for v in state["peers"].values() if v) == [a.ip], state
    assert state["cmd_bind"] == a.ip  # each daemon's IMEX on its own node's address

    # 2. The second node joins: both daemons list both nodes; the first's IMEX was signalled
    # and re-resolved its peers through its rewritten /etc/hosts.
    e.rest.create(PODS, _pod("w1", "managed-imex", node=second), ns)
    try:
        wait_for(lambda: _running(e, ns, "w1"), timeout=240, what="w1 running on the second node")
        for node in (a, b):
            wait_for(
                lambda node=node: (
                    (p := _daemon_pods(e, uid).get(node.node_name))
                    and sorted(line.split("\t")[0] for line in _hosts_block(node, p) or [])
                    == sorted([a.ip, b.ip])
                ),
                timeout=90,
                what=f"{node.node_name}'s daemon listing both peers",
            )
        joined = wait_for(
            lambda: (
                (s := _imex_state(a, uid))
                and s["reloads"] >= 1
                and sorted(v for v in s["peers"].values() if v) == sorted([a.ip, b.ip])
                and s
            ),
            timeout=60,
            what="the first node's IMEX signalled and resolving both peers",
        )
    except AssertionError as err:
        raise AssertionError(f"{err}; {why()}") from err
    assert joined["pid"] == state["pid"]  # signalled in place, not restarted
    ready = wait_for(
        lambda: (
            (o := e.rest.get(COMPUTE_DOMAINS, "managed", ns))
            and (condition(o, cd.READY) or {}).get("status") == "True"
            and o
        ),
        timeout=90,
        what="the managed domain Ready",
    )
    assert sorted(r["name"] for r in ready["status"]["nodes"]) == sorted([first, second])
    daemons = condition(ready, cd.DAEMONS_READY) or {}
    assert (daemons.get("status"), daemons.get("reason")) == ("True", "AllDaemonsReady")
    pods = _daemon_pods(e, uid)
    assert all(p["spec"].get("hostNetwork") is True for p in pods.values())
