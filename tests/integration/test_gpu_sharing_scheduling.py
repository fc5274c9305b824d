"""Shared GPUs under the real kube-scheduler (issue 32, point 6): the HGX node's GPUs published
with `--gpu-shares` (consumable `memory` and `shares`), and claims written as NVIDIA's
ConsumableShares examples write them. Two claims asking `capacity.requests.memory: 2Gi` get one
GPU between them, each with its own share; a claim asking nothing takes a whole GPU, so no
share lands beside it; and a GPU's shares bound how many claims it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.harness.controlplane import ControlPlane, KubeScheduler
from fabricdra.kubeletplugin.devices import DeviceConfig
from tests.integration.claimsched import Workloads, claim_for, publish_hgx
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

SHARES = 3
GPU_MIB = 81559


@pytest.fixture
def shared_node(control_plane: ControlPlane, tmp_path: Path) -> str:
    return publish_hgx(control_plane, tmp_path, "share", DeviceConfig(gpu_shares=SHARES))


def test_two_claims_asking_2gi_share_one_gpu(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, shared_node: str
) -> None:
    w = Workloads(control_plane, shared_node)
    w.submit("a", {"memory": "2Gi"})
    a = w.bound("a")
    w.submit("b", {"memory": "2Gi"})
    b = w.bound("b")
    assert a["device"] == b["device"], "two 2Gi claims got two GPUs, not one shared GPU"
    assert a["device"].startswith("gpu-")
    assert a["shareID"] != b["shareID"]
    for r in (a, b):
        assert r["consumedCapacity"] == {"memory": "2Gi", "shares": "1"}


def test_a_claim_asking_nothing_takes_a_whole_gpu(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, shared_node: str
) -> None:
    w = Workloads(control_plane, shared_node)
    w.submit("whole", None)
    whole = w.bound("whole")
    assert whole["consumedCapacity"] == {"memory": f"{GPU_MIB}Mi", "shares": "1"}
    w.submit("small", {"memory": "1Gi"})
    assert w.bound("small")["device"] != whole["device"]


def test_shares_bound_the_claims_on_one_gpu(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, shared_node: str
) -> None:
    # Each asks 1Gi and 1 share of the GPU the first one got: SHARES fit, the next does not.
    w = Workloads(control_plane, shared_node)
    w.submit("s0", {"memory": "1Gi"})
    first = w.bound("s0")["device"]
    for k in range(1, SHARES + 1):
        name = f"s{k}"
        claim = claim_for(name, {"memory": "1Gi"})
        claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
            {
                "cel": {
                    "expression": f'device.attributes["resource.kubernetes.io"].pciBusID == '
                    f'"{_bus(first)}"'
                }
            }
        ]
        w.submit_claim(claim)
        if k < SHARES:
            assert w.bound(name)["device"] == first
    assert "cannot allocate all claims" in w.unschedulable(f"s{SHARES}")


def _bus(device: str) -> str:
    """`gpu-0000-18-00-0` -> `0000:18:00.0`."""
    d, b, s, f = device.removeprefix("gpu-").split("-")
    return f"{d}:{b}:{s}.{f}"
