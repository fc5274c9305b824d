"""Issue 20's Kubernetes 1.36 features with the chart installed (tests/e2e/installkit.py says how
the node and the release are made): NVLink groups through the real scheduler (point 3), the
network status of a granted RDMA NIC written by the agent pod under the chart's RBAC (point 5)
and the installed controller's start-up check of the API features (point 7). Point 6 (the
health reason in the taint and the Node's Events) extends the link-down scenario in
test_install_node.py."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.binaries import bin_dir
from e2e.harness.controlplane import wait_for
from fabricdra.kube.rest import CLAIMS, Rest
from tests.e2e.installkit import (
    DRIVER,
    EXAMPLES,
    NAMESPACE,
    Installed,
    namespace,
    offered_untainted,
    own_slices,
    wait_running,
)
from tests.netns import IsolatedNetns
from tests.sysfs.nodes import nvlink_bridges

pytestmark = pytest.mark.e2e

NODE_PODS = "app.kubernetes.io/component=node"
CONTROLLER_PODS = "app.kubernetes.io/component=controller"
OTHER_MANAGER = "example.com/other-manager"


# -- helpers -------------------------------------------------------------------------------


def gpu_device(bus: str) -> str:
    """The published name of the whole GPU at PCI address `bus` (`gpu-0000-18-00-0`)."""
    return "gpu-" + re.sub(r"[:.]", "-", bus)


def published(api: client.ApiClient, node: str) -> dict[str, Any]:
    return {d.name: d for s in own_slices(api, node) for d in s.spec.devices or []}


def nvlink_groups(api: client.ApiClient, node: str, gpus: list[str]) -> dict[str, str | None]:
    """Each whole GPU's published `nvlinkGroup` (None: the attribute is absent)."""
    devices = published(api, node)
    out: dict[str, str | None] = {}
    for bus in gpus:
        attr = devices[gpu_device(bus)].attributes.get("nvlinkGroup")
        out[bus] = attr.string if attr is not None else None
    return out


def pod(name: str, claim: str, command: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
        "containers": [
            {
                "name": "c",
                "image": "localhost/busybox:e2e",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
                "resources": {"claims": [{"name": "dev"}]},
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def node_pod(api: client.ApiClient) -> Any:
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=NODE_PODS).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def restart_node_pod(installed: Installed) -> None:
    """Delete the node pod; its DaemonSet makes a new one, which must be Ready and have the
    node's devices offered untainted again (verification passed) before this returns."""
    node = installed.cluster.node_name
    with installed.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        old = node_pod(api)
        core.delete_namespaced_pod(old.metadata.name, NAMESPACE)

        def new_ready() -> bool:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=NODE_PODS).items
            return (
                len(pods) == 1
                and pods[0].metadata.uid != old.metadata.uid
                and pods[0].metadata.deletion_timestamp is None
                and all(c.ready for c in pods[0].status.container_statuses or [False])
                and bool(pods[0].status.container_statuses)
            )

        wait_for(new_ready, timeout=240, what="a new node pod Ready")
        wait_for(lambda: offered_untainted(api, node), timeout=180, what="untainted devices")


def log_lines(api: client.ApiClient, ns: str, name: str) -> list[str]:
    log = wait_for(
        lambda: client.CoreV1Api(api).read_namespaced_pod_log(name, ns) or None,
        what=f"the output of {name}",
    )
    return str(log).split()


# -- point 3: nvlinkGroup ------------------------------------------------------------------


def test_the_nvlink_pair_example_gets_two_gpus_of_one_group(installed: Installed) -> None:
    """The installed agent publishes `nvlinkGroup` from the node's recorded NVML answers: on
    the session's HGX board (every GPU linked to the four NVSwitch chips) all eight GPUs are in
    one group, named by the lowest bus id. Then the node's NVML answers are those of PCIe cards
    with two NVLink bridges joining non-adjacent GPUs (1 with 6, 3 with 4; the others have no
    NVLink): the next pass publishes two groups of two and no attribute on the rest, and
    docs/examples/gpus-nvlink-pair.yaml, applied with kubectl as a user would, gets the two
    GPUs of one bridge through the real scheduler (an allocator that took the first two GPUs,
    or a group over-claimed across the bridges, would pick unlinked GPUs); the pod runs and sees
    exactly those two GPUs' device nodes. The recorded answers are restored afterwards."""
    node = installed.cluster.node_name
    gpus = installed.host.hgx.gpus
    snapshot = installed.host.nvml_snapshot
    recorded = snapshot.read_text()
    board = {bus: min(gpus) for bus in gpus}
    bridges = [(gpus[1], gpus[6]), (gpus[3], gpus[4])]
    bridged: dict[str, str | None] = dict.fromkeys(gpus)
    for a, b in bridges:
        bridged[a] = bridged[b] = min(a, b)
    with installed.cluster.api_client() as api:
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        hgx_groups = wait_for(
            lambda: nvlink_groups(api, node, gpus) if nvlink_groups(api, node, gpus) else None,
            what="the GPUs published",
        )
    example = EXAMPLES / "gpus-nvlink-pair.yaml"
    claim_name = "gpus-nvlink-pair"
    try:
        # In place (same inode): the chart mounts the snapshot file into the agent's container.
        snapshot.write_text(json.dumps(nvlink_bridges(json.loads(recorded), bridges)))
        with namespace(installed, "nvlink") as (api, ns):
            pair_groups = wait_for(
                lambda: (
                    nvlink_groups(api, node, gpus)
                    if nvlink_groups(api, node, gpus) == bridged
                    else None
                ),
                timeout=120,
                what="the bridged groups published",
            )
            subprocess.run(
                [
                    str(bin_dir() / "kubectl"),
                    "--kubeconfig",
                    str(installed.cluster.kubeconfig),
                    "apply",
                    "-n",
                    ns,
                    "-f",
                    str(example),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            core = client.CoreV1Api(api)
            core.create_namespaced_pod(ns, pod("p", claim_name, "ls /dev; sleep 3600"))
            wait_running(core, ns, "p")
            allocated = client.ResourceV1Api(api).read_namespaced_resource_claim(claim_name, ns)
            seen = log_lines(api, ns, "p")
    finally:
        snapshot.write_text(recorded)
    with installed.cluster.api_client() as api:
        restored = wait_for(
            lambda: (
                nvlink_groups(api, node, gpus) if nvlink_groups(api, node, gpus) == board else None
            ),
            timeout=120,
            what="the board's group back",
        )

    assert hgx_groups == board
    assert pair_groups == bridged
    results = allocated.status.allocation.devices.results
    assert {r.driver for r in results} == {DRIVER}
    got = {r.device for r in results}
    assert got in [{gpu_device(a), gpu_device(b)} for a, b in bridges], got
    # kubelethost gives the GPU at gpus[i] the device minor i (/dev/nvidia<i>).
    minors = {f"nvidia{i}" for i, bus in enumerate(gpus) if gpu_device(bus) in got}
    assert {n for n in seen if re.fullmatch(r"nvidia[0-9]+", n)} == minors
    assert restored == board


# -- point 5: network status ---------------------------------------------------------------


def _endpoint(installed: Installed, rdma_device: str) -> tuple[str, str]:
    """The published device and the netdev of RDMA device `rdma_device`."""
    netdev = next(
        ep.name
        for iface in installed.host.discovery.interfaces or []
        for ep in iface.endpoints()
        if ep.rdmaDevice == rdma_device and ep.name
    )
    with installed.cluster.api_client() as api:
        devices = published(api, installed.cluster.node_name)
    name = next(
        n
        for n, d in devices.items()
        if n.startswith("rdma-")
        and d.attributes.get("rdmaDevice") is not None
        and d.attributes["rdmaDevice"].string == rdma_device
    )
    return name, str(netdev)


@contextmanager
def host_netns(installed: Installed, interfaces: dict[str, list[str]]) -> Iterator[Path]:
    """A network namespace with real interfaces, bind-mounted over `<procRoot>/1/ns/net`, where
    the agent finds the host's (on a real node `procRoot` is the host's /proc, and `1` is
    init). The node pod is restarted afterwards, so its container's rbind of procRoot holds
    the mount; yields the namespace file."""
    base = Path(installed.values["procRoot"]).parent / f"netns-{uuid.uuid4().hex[:6]}"
    target = Path(installed.values["procRoot"]) / "1" / "ns" / "net"
    with IsolatedNetns(base, interfaces) as ns:
        source = (ns.proc_root / "1").resolve() / "ns" / "net"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
        try:
            yield source
        finally:
            subprocess.run(["umount", str(target)], check=True)
            target.unlink()


def _granted(
    installed: Installed,
    nic: str,
    gpu: str,
    netdev: str,
    addresses: list[str],
    other_entry: dict[str, Any],
) -> tuple[dict[str, Any], list[dict[str, Any]], str, str]:
    """The claim (NIC + GPU, allocated and reserved by hand, the other manager's entry written
    with the allocation) once its pod runs and the agent wrote the NIC's entry; the audit
    events of writes to its status; the node pod's service account; the veth's own MAC."""
    node = installed.cluster.node_name
    with host_netns(installed, {netdev: addresses}) as netns_file:
        link = subprocess.run(
            ["nsenter", f"--net={netns_file}", "ip", "-o", "link", "show", "dev", netdev],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        veth = link.split("link/ether", 1)[1].split()[0]
        restart_node_pod(installed)
        with namespace(installed, "netstatus") as (api, ns):
            resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
            sa = node_pod(api).spec.service_account_name
            requests = [
                {"name": "nic", "exactly": {"deviceClassName": "rdma.fabricdra.io"}},
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}},
            ]
            resource.create_namespaced_resource_claim(
                ns,
                {
                    "metadata": {"name": "c"},
                    "spec": {"devices": {"requests": requests}},
                },
            )
            created = core.create_namespaced_pod(ns, pod("p", "c", "sleep 3600", node=node))
            # What a scheduler writes (allocation on this node, the pod reserved), and the
            # other manager's entry, in one apply: kubelet prepares once the pod is reserved.
            Rest(api).apply(
                CLAIMS,
                "c",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "c", "namespace": ns},
                    "status": {
                        "allocation": {
                            "devices": {
                                "results": [
                                    {
                                        "request": "nic",
                                        "driver": DRIVER,
                                        "pool": node,
                                        "device": nic,
                                    },
                                    {
                                        "request": "gpu",
                                        "driver": DRIVER,
                                        "pool": node,
                                        "device": gpu,
                                    },
                                ]
                            },
                            "nodeSelector": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": [node],
                                            }
                                        ]
                                    }
                                ]
                            },
                        },
                        "reservedFor": [
                            {"resource": "pods", "name": "p", "uid": created.metadata.uid}
                        ],
                        "devices": [other_entry],
                    },
                },
                ns,
                field_manager=OTHER_MANAGER,
                sub="status",
            )
            wait_running(core, ns, "p")

            def with_ours() -> dict[str, Any] | None:
                obj = api.sanitize_for_serialization(
                    resource.read_namespaced_resource_claim("c", ns)
                )
                entries = obj.get("status", {}).get("devices") or []
                return obj if any(e["device"] == nic for e in entries) else None

            claim = wait_for(with_ours, timeout=60, what="the NIC's network status")
            writes = [
                e
                for e in installed.cluster.control_plane.audit_events(verbs=["patch"])
                if (e.get("objectRef") or {}).get("namespace") == ns
                and e["objectRef"].get("resource") == "resourceclaims"
                and e["objectRef"].get("subresource") == "status"
            ]
    return claim, writes, sa, veth


def test_a_granted_nics_network_status_is_written_by_the_agent_beside_another_entry(
    installed: Installed,
) -> None:
    """The node's "host network namespace" (`<procRoot>/1/ns/net`) has a real interface named
    as the NIC's netdev, with an IPv4 and an IPv6 global address (and the kernel's link-local
    one). A claim holds that NIC and a GPU; another manager has written the GPU's entry in
    `status.devices` (in the same write that allocates the claim and reserves it for the pod,
    so it is there before kubelet can prepare). The pod runs; the claim's status then carries
    the NIC's entry with `networkData` (the netdev, both global addresses in CIDR form as the
    kernel gives them, the MAC from the node's sysfs, not the interface's own), the other
    manager's entry exactly as written, and the agent's write was made by the node pod's
    service account (the chart's RBAC), not an admin."""
    node = installed.cluster.node_name
    rdma_device = installed.host.hgx.rdma[4]
    nic, netdev = _endpoint(installed, rdma_device)
    # The netdev's MAC as the kernel shows it in sysfs (the sample node's tree has none).
    address = installed.host.root / "sys" / "class" / "net" / netdev / "address"
    assert not address.exists()
    sys_mac = "b8:3f:d2:00:00:44\n"
    gpu = gpu_device(installed.host.hgx.gpus[7])
    other_entry = {"driver": DRIVER, "pool": node, "device": gpu, "data": {"slot": 3}}
    addresses = ["192.0.2.10/24", "2001:db8::10/64"]
    address.write_text(sys_mac)
    try:
        claim, writes, sa, veth = _granted(installed, nic, gpu, netdev, addresses, other_entry)
    finally:
        address.unlink()

    entries = {e["device"]: e for e in claim["status"]["devices"]}
    assert set(entries) == {nic, gpu}
    assert entries[gpu] == other_entry  # as the other manager wrote it
    ours = entries[nic]
    assert (ours["driver"], ours["pool"]) == (DRIVER, node)
    data = ours["networkData"]
    assert data["interfaceName"] == netdev
    assert sorted(data["ips"]) == sorted(addresses)  # global scope only: no fe80::
    assert data["hardwareAddress"] == sys_mac.strip()
    assert veth  # the interface's own MAC, which the entry must not carry
    assert veth != sys_mac.strip()
    managers = {
        m["manager"] for m in claim["metadata"]["managedFields"] if m.get("subresource") == "status"
    }
    assert {DRIVER, OTHER_MANAGER} <= managers
    agent = f"system:serviceaccount:{NAMESPACE}:{sa}"
    by_agent = [e for e in writes if e["user"]["username"] == agent]
    assert by_agent, sorted({e["user"]["username"] for e in writes})
    assert all(e["responseStatus"]["code"] == 200 for e in by_agent)
    assert "system:masters" not in by_agent[0]["user"].get("groups", [])


# -- point 7: the controller's start-up check ----------------------------------------------


def test_the_installed_controller_reports_the_api_features_it_found(installed: Installed) -> None:
    """At 1.36 the installed controller's preflight finds every API feature ComputeDomains
    need and says so in its log (with the server's version), after a server-side dry-run
    create of its node ResourceSlice made as its own service account (the check asks the
    server, not its version); ComputeDomains are on: the controller went on to create the
    compute-domain DeviceClasses."""
    with installed.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=CONTROLLER_PODS).items
        assert len(pods) == 1, [p.metadata.name for p in pods]
        controller = pods[0]
        container = controller.spec.containers[0].name

        def found() -> str | None:
            log = core.read_namespaced_pod_log(
                controller.metadata.name, NAMESPACE, container=container
            )
            lines = [line for line in log.splitlines() if "ComputeDomains" in line]
            return "\n".join(lines) or None

        said = wait_for(found, timeout=120, what="the controller's preflight line")
        classes = wait_for(
            lambda: (
                {
                    c.metadata.name
                    for c in client.ResourceV1Api(api).list_device_class().items
                    if c.metadata.name.startswith("compute-domain-")
                }
                or None
            ),
            timeout=120,
            what="the compute-domain DeviceClasses",
        )
    user = f"system:serviceaccount:{NAMESPACE}:{controller.spec.service_account_name}"
    creates = [
        e
        for e in installed.cluster.control_plane.audit_events(verbs=["create"])
        if e["user"]["username"] == user
    ]
    dry_runs = [
        e
        for e in creates
        if (e.get("objectRef") or {}).get("resource") == "resourceslices"
        and "dryRun=All" in e.get("requestURI", "")
    ]
    made_classes = {
        e["objectRef"].get("name")
        for e in creates
        if (e.get("objectRef") or {}).get("resource") == "deviceclasses"
        and e["responseStatus"]["code"] == 201
    }

    assert "Kubernetes v1.36." in said
    assert "every API feature ComputeDomains need is on" in said
    assert "cannot run" not in said
    assert dry_runs, "the preflight asked the server with a dry-run create"
    assert classes == {
        "compute-domain-channel.fabricdra.io",
        "compute-domain-daemon.fabricdra.io",
    }
    assert made_classes == classes  # by the controller, once its check passed
