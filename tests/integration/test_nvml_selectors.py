"""NVML-derived attributes under the real kube-scheduler (issue 32, point 7): the HGX node
published from the recorded NVML answers every test and the harness's installed node replay
(tests/sysfs/nodes.py `h100_snapshot`), and claims whose selectors are written as users of
NVIDIA's DRA driver write them, translated only in their class and attribute domain:
`driverVersion` semver comparison, `productName` regex, `memory` capacity, `addressingMode`.
Each is allocated a GPU; one asking a driver newer than the node's stays Pending."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.harness.controlplane import ControlPlane, KubeScheduler
from fabricdra.kubeletplugin.devices import DeviceConfig
from tests.integration.claimsched import Workloads, claim_for, publish_hgx
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

ATTRS = 'device.attributes["devices.fabricdra.io"]'
SELECTORS = {
    "driver": f'{ATTRS}.driverVersion.compareTo(semver("550.0.0")) >= 0',
    "product": f'{ATTRS}.productName.matches("^NVIDIA H100")',
    "memory": 'device.capacity["devices.fabricdra.io"].memory.compareTo(quantity("70Gi")) >= 0',
    "cuda": f'{ATTRS}.cudaDriverVersion.compareTo(semver("12.0.0")) >= 0 && '
    f'{ATTRS}.cudaComputeCapability.compareTo(semver("9.0.0")) >= 0',
    "arch": f'{ATTRS}.architecture == "Hopper" && {ATTRS}.brand == "Nvidia" && '
    f'{ATTRS}.addressingMode == "HMM"',
}


@pytest.fixture
def recorded_node(control_plane: ControlPlane, tmp_path: Path) -> str:
    return publish_hgx(control_plane, tmp_path, "nvml", DeviceConfig())


def _submit(w: Workloads, name: str, expression: str) -> None:
    claim = claim_for(name, None)
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": expression}}
    ]
    w.submit_claim(claim)


@pytest.mark.parametrize("selector", sorted(SELECTORS))
def test_selectors_on_nvml_attributes_allocate_a_gpu(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, recorded_node: str, selector: str
) -> None:
    w = Workloads(control_plane, recorded_node)
    _submit(w, selector, SELECTORS[selector])
    assert w.bound(selector)["device"].startswith("gpu-")


def test_a_driver_newer_than_the_nodes_leaves_the_pod_pending(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, recorded_node: str
) -> None:
    w = Workloads(control_plane, recorded_node)
    _submit(w, "newer", f'{ATTRS}.driverVersion.compareTo(semver("999.0.0")) >= 0')
    assert "cannot allocate all claims" in w.unschedulable("newer")
