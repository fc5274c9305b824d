"""The multi-node harness is real and leaves nothing behind: three kubelets, each with its own
containerd, register as three distinct Ready nodes on one control plane; a pod runs on each
(its own bridge network, logs read back through apiserver -> that node's kubelet); after stop()
the machine is as it was (processes, mounts, cgroups, bridges, iptables chains, sysctls)."""

from __future__ import annotations

import ipaddress
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from e2e.harness.multinode import MAX_NODES, MultiNodeCluster
from e2e.harness.nodecluster import CGROUP_ROOT, _kubelet_chains, _read_sysctls, _run

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]


def _machine_state(base: Path, bridges: list[str], cgroup_roots: list[str]) -> dict[str, Any]:
    """What a node cluster changes on the machine and must undo."""
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cgroups = (entry / "cgroup").read_text()
        except OSError:
            continue
        if str(base) in argv or "/kubepods" in cgroups:
            procs.append(f"{entry.name}: {argv[:120]}")
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(str(base))
    ]
    logs = Path("/var/log/containers")
    links = sorted(
        str(p)
        for p in (logs.iterdir() if logs.is_dir() else ())
        if p.is_symlink() and str(p.readlink()).startswith(str(base))
    )
    return {
        "processes": procs,
        "mounts": mounts,
        "bridges": [b for b in bridges if _run(["ip", "link", "show", b]).returncode == 0],
        "cgroups": [str(p) for r in cgroup_roots for p in CGROUP_ROOT.glob(f"*/{r}")],
        "container_log_links": links,
        "iptables_chains": sorted(_kubelet_chains()),
        "sysctls": _read_sysctls(),
    }


def _pod(name: str, node: str, marker: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
            "containers": [
                {
                    "name": "c",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"echo {marker}; sleep 2"],
                }
            ],
        },
    }


def test_three_nodes_run_pods_and_leave_nothing_behind(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("multi-node-harness")
    cluster = MultiNodeCluster(base, nodes=3)
    bridges = [n.cni_bridge for n in cluster.nodes]
    cgroup_roots = [n.cgroup_root for n in cluster.nodes]
    cluster.take_machine()  # no other node cluster changes the machine while we compare
    try:
        before = _machine_state(base, bridges, cgroup_roots)
        assert not before["processes"], "a node cluster's processes are left on this machine"
        crashed = _leftovers_of_a_killed_run()
        began = time.monotonic()
        cluster.start()
        # start() swept what a killed run had left.
        assert _run(["ip", "link", "show", crashed["bridge"]]).returncode != 0
        assert not Path(crashed["cgroup"]).exists()
        assert not Path(crashed["kubelet_roots"]).exists()
        try:
            _run_a_pod_on_each_node(cluster)
        finally:
            cluster.stop(release=False)
        print(f"start, pods and stop took {time.monotonic() - began:.1f}s")
        after = _machine_state(base, bridges, cgroup_roots)
    finally:
        cluster.release_machine()
    assert after == before


def _leftovers_of_a_killed_run() -> dict[str, str]:
    """A bridge, a cgroup root and a kubelet-roots folder with a mount in it, as a multi-node
    run killed with SIGKILL leaves them (its daemons die with it; these do not)."""
    bridge = f"fdra-mn{MAX_NODES - 1}"
    assert _run(["ip", "link", "add", bridge, "type", "bridge"]).returncode == 0
    cgroup = CGROUP_ROOT / "memory" / f"fabricdra-e2e-node-{MAX_NODES - 1}" / "kubepods"
    cgroup.mkdir(parents=True)
    roots = Path(tempfile.gettempdir()) / "fdra-mn-crashed"
    (roots / "0" / "pods").mkdir(parents=True)
    assert _run(["mount", "-t", "tmpfs", "tmpfs", str(roots / "0" / "pods")]).returncode == 0
    return {"bridge": bridge, "cgroup": str(cgroup.parent), "kubelet_roots": str(roots)}


def _run_a_pod_on_each_node(cluster: MultiNodeCluster) -> None:
    print(f"\n3 nodes Ready in {cluster.start_seconds:.1f}s")
    names = [n.node_name for n in cluster.nodes]
    assert len(set(names)) == 3
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        nodes = {n.metadata.name: n for n in core.list_node().items}
        assert sorted(nodes) == sorted(names)
        for node in cluster.nodes:
            obj = nodes[node.node_name]
            ready = {c.type: c.status for c in obj.status.conditions}["Ready"]
            assert ready == "True"
            internal = [a.address for a in obj.status.addresses if a.type == "InternalIP"]
            assert internal == [node.ip]  # distinct per node: IMEX peers differ by it
            assert obj.status.daemon_endpoints.kubelet_endpoint.port == node.kubelet_port
        ns = f"mn-{uuid.uuid4().hex[:8]}"
        cluster.control_plane.create_namespace(ns)
        markers = {n.node_name: uuid.uuid4().hex for n in cluster.nodes}
        for i, node in enumerate(cluster.nodes):
            core.create_namespaced_pod(ns, _pod(f"p{i}", node.node_name, markers[node.node_name]))
        for i, node in enumerate(cluster.nodes):
            phase = wait_for(
                lambda i=i: (
                    (p := core.read_namespaced_pod(f"p{i}", ns).status.phase)
                    in ("Succeeded", "Failed")
                    and p
                ),
                timeout=120,
                what=f"pod p{i} to finish",
            )
            pod = core.read_namespaced_pod(f"p{i}", ns)
            assert phase == "Succeeded"
            assert pod.spec.node_name == node.node_name
            # Its own node's bridge network: the pod IP is in that node's subnet.
            subnet = ipaddress.ip_network(f"10.245.{node.index}.0/24")
            assert ipaddress.ip_address(pod.status.pod_ip) in subnet
            # Logs come from this node's kubelet, through the apiserver.
            logs = core.read_namespaced_pod_log(f"p{i}", ns, container="c")
            assert logs.split() == [markers[node.node_name]]
        # Each kubelet keeps its pods under its own cgroup root.
        for node in cluster.nodes:
            assert (CGROUP_ROOT / "memory" / node.cgroup_root / "kubepods").is_dir()
