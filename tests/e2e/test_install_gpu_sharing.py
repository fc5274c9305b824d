"""In-cluster: shared GPUs with the chart installed (issue 32, point 6).

With `gpus.shares: 4` the node agent publishes each whole GPU with consumable `memory` and
`shares`; two pods whose claims ask `capacity.requests.memory: 2Gi` (NVIDIA's ConsumableShares
example, translated only in its class name) are allocated the same GPU by the real scheduler,
both run, and prepare hands both containers that one GPU's device node. The release goes back
to the session's values afterwards (GPUs unshared)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from tests.e2e.installkit import NAMESPACE, Installed, gpu_claim, own_slices, wait_running
from tests.e2e.installkit import run_pod as start_pod

pytestmark = pytest.mark.e2e

BUS_ID = 'device.attributes["resource.kubernetes.io"].pciBusID'
LIST_GPUS = (
    'for n in /dev/nvidia[0-9]*; do [ -e "$n" ] && echo "GPU $n"; done; echo LISTED; sleep 3600'
)


def _shared_gpus(api: client.ApiClient, node: str) -> list[Any] | None:
    gpus = [
        d
        for s in own_slices(api, node)
        for d in s.spec.devices or []
        if d.attributes["type"].string == "gpu"
    ]
    ok = gpus and all(d.allow_multiple_allocations and "shares" in d.capacity for d in gpus)
    return gpus if ok and not any(d.taints for d in gpus) else None


def _held(api: client.ApiClient) -> set[str]:
    """Devices some claim in the cluster is allocated now (other scenarios' pods)."""
    claims = client.ResourceV1Api(api).list_resource_claim_for_all_namespaces().items
    return {
        r.device
        for c in claims
        if c.status and c.status.allocation
        for r in c.status.allocation.devices.results or []
    }


def _gpu_nodes(core: client.CoreV1Api, ns: str, pod: str) -> list[str]:
    def listed() -> str | None:
        text = str(core.read_namespaced_pod_log(pod, ns))
        return text if "LISTED" in text else None

    log = wait_for(listed, what=f"pod {pod}'s GPUs")
    return re.findall(r"^GPU (\S+)$", log, re.M)


def test_two_pods_asking_2gi_share_one_gpu(installed: Installed) -> None:
    node = installed.cluster.node_name
    kubeconfig = installed.cluster.kubeconfig
    shared = {**installed.values, "gpus": {"enabled": True, "shares": 4}}
    installed.chart.install(kubeconfig, NAMESPACE, values=shared)
    try:
        ns = f"gpushare-{uuid.uuid4().hex[:6]}"
        with installed.cluster.api_client() as api:
            core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
            gpus = wait_for(lambda: _shared_gpus(api, node), timeout=180, what="shared GPUs")
            held = _held(api)
            free = next(g for g in gpus if g.name not in held)
            bus_id = free.attributes["resource.kubernetes.io/pciBusID"].string
            core.create_namespace({"metadata": {"name": ns}})
            wait_for(lambda: core.read_namespaced_service_account("default", ns), what="SA")
            for name in ("a", "b"):
                # A GPU no other scenario holds: only shares meet on it.
                on_free = f'{BUS_ID} == "{bus_id}"'
                claim = gpu_claim(name, on_free, {"memory": "2Gi"})
                resource.create_namespaced_resource_claim(ns, claim)
                start_pod(api, ns, name, name, command=LIST_GPUS)
            for name in ("a", "b"):
                wait_running(core, ns, name)
            results = {}
            for name in ("a", "b"):
                c = resource.read_namespaced_resource_claim(name, ns)
                [results[name]] = c.status.allocation.devices.results
            nodes = {name: _gpu_nodes(core, ns, name) for name in ("a", "b")}
            core.delete_namespace(ns)
    finally:
        installed.chart.install(kubeconfig, NAMESPACE, values=installed.values)
    assert results["a"].device == results["b"].device == free.name
    assert results["a"].share_id != results["b"].share_id
    for r in results.values():
        assert r.consumed_capacity == {"memory": "2Gi", "shares": "1"}
    assert len(nodes["a"]) == 1, nodes
    assert nodes["a"] == nodes["b"]
