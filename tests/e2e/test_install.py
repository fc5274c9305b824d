"""In-cluster scenarios 1, 2 and 7 of the install (tests/e2e/installkit.py says how the node
and the release are made)."""

from __future__ import annotations

import stat
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness.controlplane import wait_for
from fabricdra.kubeletplugin.kubelet import PluginPaths
from tests.e2e.installkit import (
    EXAMPLES,
    NAMESPACE,
    Installed,
    offered_untainted,
    own_slices,
    run_pod,
    wait_running,
)

pytestmark = pytest.mark.e2e


def test_install_publishes_slices_record_and_labels_and_is_ready(installed: Installed) -> None:
    node = installed.cluster.node_name
    with installed.cluster.api_client() as api:
        devices = wait_for(
            lambda: offered_untainted(api, node), timeout=120, what="untainted devices"
        )
        types = {d.attributes["type"].string for d in devices}
        assert {"gpu", "rdma"} <= types
        record = client.CustomObjectsApi(api).get_cluster_custom_object(
            "fabricdra.io", "v1alpha1", "nodedevices", node
        )
        assert len(record["spec"]["groups"]) > 0
        labels = client.CoreV1Api(api).read_node(node).metadata.labels
        assert any(k.startswith("fabricdra.io/") for k in labels)
        apps = client.AppsV1Api(api)

        def ready() -> bool:
            # helm --wait accepts a DaemonSet with maxUnavailable pods not Ready, so wait here.
            ds = apps.read_namespaced_daemon_set("fabricdra-node", NAMESPACE).status
            dep = apps.read_namespaced_deployment("fabricdra-controller", NAMESPACE).status
            return ds.number_ready == ds.desired_number_scheduled == 1 and dep.ready_replicas == 1

        wait_for(ready, timeout=120, what="every component Ready")


def test_gpu_and_its_own_nic_reach_the_pod_and_nothing_else(installed: Installed) -> None:
    node = installed.cluster.node_name
    ns = f"install-{uuid.uuid4().hex[:6]}"
    with installed.cluster.api_client() as api:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        claim = yaml.safe_load((EXAMPLES / "gpu-nic-pxb.yaml").read_text())
        resource.create_namespaced_resource_claim(ns, claim)
        run_pod(api, ns, "p", claim["metadata"]["name"])

        def running() -> Any:
            pod = core.read_namespaced_pod("p", ns)
            return pod if pod.status.phase == "Running" else None

        wait_for(running, timeout=120, what="the pod with its claim to run")
        log = wait_for(
            lambda: core.read_namespaced_pod_log("p", ns) or None, what="the pod's output"
        )
        allocated = resource.read_namespaced_resource_claim(claim["metadata"]["name"], ns)
        results = {r.request: r.device for r in allocated.status.allocation.devices.results}
        devices = {d.name: d for s in own_slices(api, node) for d in s.spec.devices or []}
        nic = devices[results["nic"]]
        core.delete_namespace(ns)

    lines = log.split()
    rdma_device = nic.attributes["rdmaDevice"].string
    assert f"NCCL_IB_HCA=={rdma_device}" in lines
    verbs = {
        ep.rdmaDevice: ep.verbsDevice
        for iface in installed.host.discovery.interfaces or []
        for ep in iface.endpoints()
    }[rdma_device]
    assert sorted(lines[1:]) == sorted([verbs, "rdma_cm"])


def test_helm_upgrade_keeps_running_claims_and_new_pods_start(installed: Installed) -> None:
    node = installed.cluster.node_name
    ns = f"upgrade-{uuid.uuid4().hex[:6]}"
    with installed.cluster.api_client() as api:
        core, resource, apps = (
            client.CoreV1Api(api),
            client.ResourceV1Api(api),
            client.AppsV1Api(api),
        )
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        claim = yaml.safe_load((EXAMPLES / "gpu-nic-pxb.yaml").read_text())
        resource.create_namespaced_resource_claim(ns, claim)
        run_pod(api, ns, "before", claim["metadata"]["name"])
        before = wait_running(core, ns, "before")
        old = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=node"
        ).items[0]
        old_pod = old.metadata.name

        # A changed pod template rolls the DaemonSet, as a new image tag would.
        installed.chart.install(
            installed.cluster.kubeconfig,
            NAMESPACE,
            values={**installed.values, "logLevel": "debug"},
        )

        def rolled() -> bool:
            pods = core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/component=node"
            ).items
            # One pod, not the old one: with the surge both run for a moment.
            return (
                len(pods) == 1
                and pods[0].metadata.name != old_pod
                and all(p.status.phase == "Running" for p in pods)
            )

        wait_for(rolled, timeout=180, what="the node DaemonSet to roll")
        ds = apps.read_namespaced_daemon_set("fabricdra-node", NAMESPACE)
        wait_for(
            lambda: (
                apps.read_namespaced_daemon_set("fabricdra-node", NAMESPACE).status.number_ready
                == 1
            ),
            timeout=120,
            what="the new node pod Ready",
        )
        new = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=node"
        ).items[0]
        sockets = _plugin_sockets(installed)
        second = {**claim, "metadata": {"name": "after"}}
        resource.create_namespaced_resource_claim(ns, second)
        run_pod(api, ns, "after", "after")
        wait_running(core, ns, "after")
        still = core.read_namespaced_pod("before", ns)
        kept = resource.read_namespaced_resource_claim(claim["metadata"]["name"], ns)
        core.delete_namespace(ns)

    assert ds.spec.template.spec.containers[0].args[0] == "--log-level=debug"
    # The roll surged (maxSurge 10%: this one node): the old pod exited only after the new one
    # was Ready, and its exit removed its own sockets only. The new pod's containers never
    # restarted, so the sockets they made at start are the ones still there.
    assert ds.spec.update_strategy.rolling_update.max_surge == "10%"
    assert all(c.restart_count == 0 for c in new.status.container_statuses)
    assert sockets == _expected_sockets(installed, new.metadata.uid)
    assert old.metadata.uid != new.metadata.uid
    assert still.status.phase == "Running"
    assert still.metadata.uid == before.metadata.uid
    assert still.status.container_statuses[0].restart_count == 0
    assert [r.uid for r in kept.status.reserved_for] == [before.metadata.uid]


def _expected_sockets(installed: Installed, pod_uid: str) -> set[str]:
    """One pod's sockets of both drivers (per-pod names, upstream's rolling-update scheme; the
    UID cut to fit a unix socket address under the harness's long kubelet root)."""
    root = installed.cluster.kubelet_root
    out = set()
    for driver in ("devices.fabricdra.io", "compute-domain.fabricdra.io"):
        paths = PluginPaths.for_driver(
            driver,
            registry_dir=root / "plugins_registry",
            plugin_dir=root / "plugins" / driver,
            instance=pod_uid,
        )
        out |= {str(p.relative_to(root)) for p in (paths.registration_socket, paths.dra_socket)}
    return out


def _plugin_sockets(installed: Installed) -> set[str]:
    """Every fabricdra socket in the kubelet's plugin folders, relative to its root dir."""
    root = installed.cluster.kubelet_root
    found = [
        *(root / "plugins_registry").glob("*.fabricdra.io-*reg.sock"),
        *(root / "plugins").glob("*.fabricdra.io/*.sock"),
    ]
    return {str(p.relative_to(root)) for p in found if stat.S_ISSOCK(p.lstat().st_mode)}
