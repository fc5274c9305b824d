"""In-cluster: the installed node publishes NVML's answers for its GPUs (issue 32, point 7).

The harness's node replays the recorded H100 answers every unit test uses (tests/sysfs/nodes.py
`h100_snapshot`, handed to the chart as `nvmlSnapshot`), so the NVML-derived attributes reach
the published ResourceSlices, and claims whose selectors are written as users of NVIDIA's DRA
driver write them (translated only in their class and attribute domain) run pods on the GPUs
they pick; one asking a driver newer than the node's leaves its pod Pending, allocated nothing.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from tests.e2e.installkit import (
    Installed,
    gpu_claim,
    namespace,
    offered_untainted,
    own_slices,
    wait_running,
)
from tests.e2e.installkit import run_pod as start_pod

pytestmark = pytest.mark.e2e

ATTRS = 'device.attributes["devices.fabricdra.io"]'
SELECTORS = {
    "driver": f'{ATTRS}.driverVersion.compareTo(semver("550.0.0")) >= 0',
    "product": f'{ATTRS}.productName.matches("^NVIDIA H100")',
    "memory": 'device.capacity["devices.fabricdra.io"].memory.compareTo(quantity("70Gi")) >= 0',
}


def test_the_installed_node_publishes_nvml_attributes_users_select_on(
    installed: Installed,
) -> None:
    node = installed.cluster.node_name
    with installed.cluster.api_client() as api:
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        gpus = [
            d
            for s in own_slices(api, node)
            for d in s.spec.devices or []
            if d.attributes["type"].string == "gpu"
        ]
    assert len(gpus) == 8
    for gpu in gpus:
        a = gpu.attributes
        assert a["driverVersion"].version == "550.54.15"
        assert a["cudaDriverVersion"].version == "12.4.0"
        assert a["cudaComputeCapability"].version == "9.0.0"
        assert (a["architecture"].string, a["brand"].string) == ("Hopper", "Nvidia")
        assert a["addressingMode"].string == "HMM"


def test_selectors_on_nvml_attributes_run_pods_and_a_newer_driver_stays_pending(
    installed: Installed,
) -> None:
    with namespace(installed, "nvmlsel") as (api, ns):
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        for name, expression in SELECTORS.items():
            resource.create_namespaced_resource_claim(ns, gpu_claim(name, expression))
            start_pod(api, ns, name, name, command="echo started; sleep 3600")
        newer = f'{ATTRS}.driverVersion.compareTo(semver("999.0.0")) >= 0'
        resource.create_namespaced_resource_claim(ns, gpu_claim("newer", newer))
        start_pod(api, ns, "newer", "newer", command="echo started; sleep 3600")
        for name in SELECTORS:
            wait_running(core, ns, name)
            claim = resource.read_namespaced_resource_claim(name, ns)
            [result] = claim.status.allocation.devices.results
            assert result.device.startswith("gpu-"), (name, result.device)

        def pending() -> str | None:
            pod = core.read_namespaced_pod("newer", ns)
            assert pod.spec.node_name is None
            for c in pod.status.conditions or []:
                if c.type == "PodScheduled" and c.reason == "Unschedulable":
                    return str(c.message)
            return None

        assert "cannot allocate all claims" in wait_for(pending, what="newer found unschedulable")
        left = resource.read_namespaced_resource_claim("newer", ns).status
        assert left is None or left.allocation is None
