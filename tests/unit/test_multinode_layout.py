"""The multi-node harness's rules that need no running cluster: what each node gets of its own,
that its plugin sockets fit a unix socket address, the order of the e2e tests, and failing at
once (not after a 20-minute wait on itself) when this process already runs a node cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.harness import nodecluster
from e2e.harness.errors import HarnessError
from e2e.harness.multinode import MultiNodeCluster
from e2e.harness.nodecluster import NodeCluster, kubelet_config
from e2e.harness.pytest_plugin import pytest_collection_modifyitems

UNIX_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL
LONGEST_SOCKET = "compute-domain.fabricdra.io-reg.sock"


def test_each_node_has_its_own_address_folders_network_and_cgroup_root(tmp_path: Path) -> None:
    cluster = MultiNodeCluster(tmp_path / "a" / "deep" / "pytest" / "folder", nodes=3)
    nodes = cluster.nodes
    for attr in (
        "node_name",
        "ip",
        "kubelet_root",
        "cdi_dir",
        "containerd_socket",
        "logs_dir",
        "cni_bridge",
        "cgroup_root",
    ):
        values = [getattr(n, attr) for n in nodes]
        assert len(set(values)) == 3, f"{attr} is shared: {values}"
    assert [n.ip for n in nodes] == ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
    assert all(n.node_name == n.ip for n in nodes)  # the apiserver dials the Hostname address
    for n in nodes:
        # Linux interface names hold 15 characters.
        assert len(n.cni_bridge) <= 15
        # However deep the test's tmp dir, the kubelet root is short enough for plugin sockets.
        for folder in (n.plugins_registry_dir, n.plugins_dir / "compute-domain.fabricdra.io"):
            assert len(str(folder / LONGEST_SOCKET)) <= UNIX_PATH_MAX
    assert not cluster.kubelet_roots.exists()  # nothing is created before start()


def test_node_count_is_checked(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"1\.\.40 nodes, not 0"):
        MultiNodeCluster(tmp_path, nodes=0)


def test_kubelet_cgroup_root_only_when_asked(tmp_path: Path) -> None:
    kw: dict[str, Any] = {
        "address": "127.0.0.12",
        "port": 10250,
        "containerd_socket": tmp_path / "c.sock",
        "client_ca": tmp_path / "ca.crt",
        "base": tmp_path,
    }
    single = kubelet_config(**kw)
    assert "cgroupRoot" not in single  # the single-node cluster keeps the machine's root
    assert single["address"] == single["healthzBindAddress"] == "127.0.0.12"
    assert kubelet_config(**kw, cgroup_root="/fabricdra-e2e-node-1")["cgroupRoot"] == (
        "/fabricdra-e2e-node-1"
    )


def test_a_second_cluster_in_this_process_fails_at_once(tmp_path: Path) -> None:
    """As when the single-node cluster is up for the session and a multi-node test starts."""
    nodecluster.LOCK_HOLDER.append("single-node cluster")
    try:
        with pytest.raises(HarnessError, match="already runs a single-node cluster"):
            MultiNodeCluster(tmp_path, nodes=1).take_machine()
        with pytest.raises(HarnessError, match="already runs a single-node cluster"):
            NodeCluster(tmp_path)._take_lock()
    finally:
        nodecluster.LOCK_HOLDER.clear()


class _Item:
    def __init__(self, name: str, fixtures: tuple[str, ...], multinode: bool = False) -> None:
        self.name = name
        self.fixturenames = fixtures
        self.markers = {"multinode"} if multinode else set()

    def add_marker(self, marker: Any) -> None:
        self.markers.add(marker.name)

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.markers else None


def test_multi_node_tests_run_before_the_single_node_cluster_holds_the_machine() -> None:
    items = [
        _Item("unit", ()),
        _Item("smoke", ("node_cluster",)),
        _Item("span", ("multi_node_cluster",)),
        _Item("harness", (), multinode=True),
        _Item("plugin", ("cluster",)),
        _Item("failover", ("env", "multi_node_cluster")),
    ]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["span", "harness", "failover", "unit", "smoke", "plugin"]
    by_name = {i.name: i.markers for i in items}
    assert by_name["span"] == {"e2e", "multinode"}
    assert by_name["smoke"] == {"e2e"}
    assert by_name["unit"] == set()


def test_pods_route_the_other_nodes_pod_subnets_and_the_single_node_stays_as_it_was(
    tmp_path: Path,
) -> None:
    import json

    from e2e.harness.multinode import POD_NETWORK
    from e2e.harness.nodecluster import write_cni_config

    def ipam(folder: Path, **kw: Any) -> dict[str, Any]:
        write_cni_config(folder, "br0", "10.245.1.0/24", folder / "ipam", **kw)
        conf = json.loads((folder / "10-fabricdra-e2e.conflist").read_text())
        result: dict[str, Any] = conf["plugins"][0]["ipam"]
        return result

    assert "routes" not in ipam(tmp_path / "single")
    assert ipam(tmp_path / "multi", routes=[POD_NETWORK])["routes"] == [{"dst": POD_NETWORK}]
