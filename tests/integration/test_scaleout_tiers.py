"""The scale-out tier labels (issue 27 points 3-5) against a real kube-apiserver: the
controller under --scale-out-tiers joins the NodeDevices records' NIC neighbours with a topology
file and an ibnetdiscover ConfigMap into fabricdra.io/network.tier-1/-2/-3 on the Nodes, fails a
mis-cabled node by name (no tiers, a record, an Event), and removes labels per docs/labels.md."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import labels
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.cli import main
from fabricdra.cli.topology import kueue, rows
from fabricdra.controller import rbac
from fabricdra.controller.manager import Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings
from fabricdra.controller.scaleout import group_name
from fabricdra.controller.tierlabels import TREE
from fabricdra.kube.rest import (
    CONFIG_MAPS,
    EVENTS,
    NODE_DEVICES,
    NODES,
    Kind,
    NotFound,
    Rest,
)

from .computedomain_helpers import unique
from .dra_setup import installed  # noqa: F401 - a fixture (the NodeDevices CRD)

RBAC_ROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", False)
RBAC_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False)
RBAC_NS_ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", True)
RBAC_NS_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", True)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("leaves_nothing_behind", "installed"),
]

TOR_A, TOR_B = "b8:59:9f:00:00:0a", "b8:59:9f:00:00:0b"
TOPOLOGY = f"""
switches:
  "{TOR_A}": spine-1
  "{TOR_B}": spine-1
  spine-1: core-1
"""
LEAF, SPINE, PORT = "0xb8599f0300f00001", "0xb8599f0300f00002", "0x0c42a10300f00101"
# An InfiniBand fabric of one leaf and one spine as ibnetdiscover prints it (rdma-core
# infiniband-diags/ibnetdiscover.c; tests/fabrics/superpod.py has a whole scalable unit).
DUMP = """#
# Topology file: generated on Mon Dec  7 03:00:00 2026
#
vendid=0x2c9
devid=0xd2f0
sysimgguid=0xb8599f0300f00001
switchguid=0xb8599f0300f00001(b8599f0300f00001)
Switch\t65 "S-b8599f0300f00001"\t\t# "MF0;ib-leaf1:MQM9700/U1" enhanced port 0 lid 1 lmc 0
[1]\t"H-0c42a10300f00100"[1](c42a10300f00101) \t\t# "ibnode mlx5_0" lid 3 4xNDR
[33]\t"S-b8599f0300f00002"[1]\t\t# "MF0;ib-spine1:MQM9700/U1" lid 2 4xNDR

vendid=0x2c9
devid=0xd2f0
sysimgguid=0xb8599f0300f00002
switchguid=0xb8599f0300f00002(b8599f0300f00002)
Switch\t65 "S-b8599f0300f00002"\t\t# "MF0;ib-spine1:MQM9700/U1" enhanced port 0 lid 2 lmc 0
[1]\t"S-b8599f0300f00001"[33]\t\t# "MF0;ib-leaf1:MQM9700/U1" lid 1 4xNDR

vendid=0x2c9
devid=0x1021
sysimgguid=0xc42a10300f00100
caguid=0xc42a10300f00100
Ca\t1 "H-0c42a10300f00100"\t\t# "ibnode mlx5_0"
[1](c42a10300f00101) \t"S-b8599f0300f00001"[1]\t\t# lid 3 lmc 0 "MF0;ib-leaf1:MQM9700/U1" lid 1 \
4xNDR
"""


def _nic(name: str, rail: int, switch: str | None, port_guid: str | None = None) -> dict[str, Any]:
    so: dict[str, Any] = {"rail": rail, "railSource": "measured", "role": "compute"}
    if switch:
        so["neighbour"] = {
            "switch": switch,
            "port": "Ethernet1",
            "source": "measured",
            "via": "lldp",
        }
    if port_guid:
        so["portGuid"] = port_guid
    return {
        "name": name,
        "bus": "pci",
        "virtual": False,
        "rdma": True,
        "rdmaDevice": f"mlx5_{rail}",
        "scaleOut": so,
    }


def _publish(rest: Rest, node: str, nics: list[dict[str, Any]]) -> None:
    body = {
        "apiVersion": "fabricdra.io/v1alpha1",
        "kind": "NodeDevices",
        "metadata": {"name": node},
    }
    try:
        obj = rest.get(NODE_DEVICES, node)
    except NotFound:
        rest.create(NODE_DEVICES, {**body, "spec": {"interfaces": nics}})
        return
    rest.patch(NODE_DEVICES, node, {"spec": {"interfaces": nics}})
    assert obj


def _tiers(rest: Rest, node: str) -> tuple[str | None, ...]:
    got = rest.get(NODES, node)["metadata"].get("labels") or {}
    return tuple(got.get(k) for k in TIER_LABELS)


def _record(rest: Rest, node: str) -> dict[str, Any] | None:
    ann = rest.get(NODES, node)["metadata"].get("annotations") or {}
    raw = ann.get(labels.CABLING_CHECK)
    return None if raw is None else dict(json.loads(raw))


def _events(rest: Rest, node: str, reason: str) -> list[dict[str, Any]]:
    items = rest.list(EVENTS, "default").get("items", [])
    return [
        e
        for e in items
        if e.get("involvedObject", {}).get("name") == node and e["reason"] == reason
    ]


def test_controller_writes_checks_and_removes_tier_labels(
    control_plane: ControlPlane, rest: Rest, tmp_path: Path
) -> None:
    driver_ns = unique("so-system")
    control_plane.create_namespace(driver_ns)
    # The controller runs as a non-admin user with exactly the chart's rules (rbac.py).
    user = unique("fabricdra-controller")
    rest.create(RBAC_ROLES, rbac.cluster_role(user, rbac.CONTROLLER))
    rest.create(RBAC_BINDINGS, rbac.binding_for_user(user, user, user))
    rest.create(RBAC_NS_ROLES, rbac.role(user, driver_ns, rbac.CONTROLLER_NAMESPACED), driver_ns)
    rest.create(
        RBAC_NS_BINDINGS, rbac.role_binding_for_user(user, driver_ns, user, user), driver_ns
    )
    kubeconfig = control_plane.kubeconfig_for(user, user)
    n1, n2, bad, ib, silent = (unique(p) for p in ("so-a", "so-b", "so-bad", "so-ib", "so-quiet"))
    for name in (n1, n2, bad, ib):
        control_plane.create_node(name)
    # A node whose agent has not reported: its labels are nobody's guess, left as they are.
    control_plane.create_node(silent, {TIER_LABELS[0]: "set-by-hand"})
    for name in (n1, n2):
        _publish(rest, name, [_nic("ens1np0", 0, TOR_A), _nic("ens2np1", 1, TOR_B)])
    # Mis-cabled: its rail-1 cable on the rail-0 ToR.
    _publish(rest, bad, [_nic("ens1np0", 0, TOR_A), _nic("ens2np1", 1, TOR_A)])
    # InfiniBand with no SMP answer: its leaf comes from the ibnetdiscover ConfigMap.
    _publish(rest, ib, [_nic("ibp24s0", 0, None, PORT)])
    # `fabricdra fabric-dump` stores it, as a user with exactly the chart's fabric-dump Role
    # (tests/integration/test_chart_scaleout.py): created, then replaced by the next run.
    dumper = unique("fabric-dump")
    rules = [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["ibnetdiscover-fabric-a"],
            "verbs": ["get", "update"],
        },
    ]
    rest.create(RBAC_NS_ROLES, rbac.role(dumper, driver_ns, rules), driver_ns)
    rest.create(
        RBAC_NS_BINDINGS, rbac.role_binding_for_user(dumper, driver_ns, dumper, dumper), driver_ns
    )
    dump_file = tmp_path / "ibnetdiscover.txt"
    dump_file.write_text(DUMP)
    dump_args = ["fabric-dump", "--fabric", "fabric-a", "--file", str(dump_file)]
    dump_args += ["--namespace", driver_ns]
    dump_args += ["--kubeconfig", str(control_plane.kubeconfig_for(dumper, dumper))]
    assert main(dump_args) == 0
    assert main(dump_args) == 0
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    rack = group_name([TOR_A, TOR_B])
    from kubernetes import config as kube_config

    cfg = ControllerConfig(
        namespace=driver_ns,
        daemon=DaemonSettings(namespace=driver_ns),
        resync_seconds=5.0,
        leader_election=False,
        lease_name=unique("so-controller"),
        scale_out_tiers=True,
        topology_file=str(topology),
    )
    controller = Controller(kube_config.new_client_from_config(config_file=str(kubeconfig)), cfg)
    controller.start()
    try:
        for name in (n1, n2):
            wait_for(lambda n=name: _tiers(rest, n) == (rack, "spine-1", "core-1"), what=name)
        wait_for(lambda: _tiers(rest, ib) == (LEAF, SPINE, None), what="ib node's tiers")
        wait_for(lambda: _record(rest, bad) is not None, what="the failed node's record")
        record = _record(rest, bad)
        assert record is not None
        assert record["result"] == "Failed"
        assert "ens1np0 and ens2np1 all reach leaf b8:59:9f:00:00:0a" in record["findings"][0]
        assert _tiers(rest, bad) == (None, None, None)
        assert _record(rest, n1) == {"result": "Passed", "railOptimised": True, "leaves": 2}
        wait_for(lambda: _events(rest, bad, "ScaleOutCablingFailed"), what="the event")
        assert _tiers(rest, silent) == ("set-by-hand", None, None)

        # `fabricdra topology` reads the same tree back from the published records.
        view = {
            r.name: r for r in rows(rest.list(NODES)["items"], rest.list(NODE_DEVICES)["items"])
        }
        assert view[n1].tiers == (rack, "spine-1", "core-1")
        assert [n["rail"] for n in view[n1].nics] == [0, 1]
        assert view[bad].cabling is not None
        assert view[bad].cabling["result"] == "Failed"
        obj, left_out = kueue([view[n] for n in (n1, n2, bad)], "t")
        assert [lv["nodeLabel"] for lv in obj["spec"]["levels"]][:3] == list(reversed(TIER_LABELS))
        assert left_out == [bad]

        # Nothing changed: nothing is rewritten.
        versions = {n: rest.get(NODES, n)["metadata"]["resourceVersion"] for n in (n1, bad, ib)}
        controller.reconcile_tiers(TREE)
        after = {n: rest.get(NODES, n)["metadata"]["resourceVersion"] for n in (n1, bad, ib)}
        assert after == versions

        # Fixed: the node gets its tiers back, and a Normal event says so.
        _publish(rest, bad, [_nic("ens1np0", 0, TOR_A), _nic("ens2np1", 1, TOR_B)])
        wait_for(lambda: _tiers(rest, bad) == (rack, "spine-1", "core-1"), what="fixed")
        wait_for(lambda: _events(rest, bad, "ScaleOutCablingPassed"), what="passed event")

        # Its neighbours no longer known (readings withdrawn): its tiers and record go.
        _publish(rest, n2, [_nic("ens1np0", 0, None), _nic("ens2np1", 1, None)])
        wait_for(lambda: _tiers(rest, n2) == (None, None, None), what="n2's tiers removed")
        wait_for(lambda: _record(rest, n2) is None, what="n2's record removed")

        # The dump is gone: the IB node's tiers above what its NICs say are gone too.
        rest.delete(CONFIG_MAPS, "ibnetdiscover-fabric-a", driver_ns)
        wait_for(lambda: _tiers(rest, ib) == (None, None, None), what="ib tiers removed")

        # A hand edit of a tier label is put back.
        rest.patch(NODES, n1, {"metadata": {"labels": {TIER_LABELS[1]: "edited"}}})
        wait_for(lambda: _tiers(rest, n1) == (rack, "spine-1", "core-1"), what="restored")
    finally:
        controller.stop()
        for name in (n1, n2, bad, ib):
            with contextlib.suppress(NotFound):
                rest.delete(NODE_DEVICES, name)
