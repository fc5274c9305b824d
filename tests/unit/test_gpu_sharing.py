"""GPU sharing (issue 32, point 6; gpusharing.py): a whole NVIDIA GPU published with
consumable `memory` and `shares` (request policies whose defaults take the whole GPU), prepare
handing every sharer the same GPU and refusing what the GPU cannot honour, and the sharing
strategies (TimeSlicing, MPS) a claim configures with an opaque `GpuConfig`.

Over the fake host of the kubelet-plugin tests (HGX sysfs tree, recorded NVML answers, real
character devices in a dev root); claims from the in-memory claim store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fabricdra.cli import UsageError, build_parser
from fabricdra.cli.kubelet_plugin import build_config
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig
from fabricdra.kubeletplugin.resourceslices import ApiFeatures, build_slices
from tests.integration.kubelethost import Host, build_host
from tests.unit.test_prepare_exclusivity import GPU0, MIG71, NODE, Node, res

SHARE = [f"{k:08x}-1111-2222-3333-444455556666" for k in range(8)]
GPU_MIB = 81559  # the recorded H100 80GB HBM3


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("host"), mig_gpu=7)


def shared_inventory(host: Host, shares: int = 4) -> Any:
    d = host.discovery
    return build_devices(d.interfaces or [], d.accelerators or [], DeviceConfig(gpu_shares=shares))


@pytest.fixture
def node(tmp_path: Path, host: Host) -> Node:
    return Node(tmp_path, host, shared_inventory(host))


def share(k: int, **consumed: str) -> dict[str, Any]:
    return res("gpu", GPU0, shareID=SHARE[k], consumedCapacity=consumed)


def _devices(host: Host, shares: int, model: str = "current") -> dict[str, Any]:
    plan = build_slices(shared_inventory(host, shares), NODE, features=ApiFeatures(model))  # type: ignore[arg-type]
    return {d["name"]: d for s in plan.slices for d in s["spec"].get("devices", [])}


# -- what is published ------------------------------------------------------------------------


def test_a_shared_gpu_offers_memory_and_shares_whose_defaults_take_the_whole_gpu(
    host: Host,
) -> None:
    gpu = _devices(host, 4)[GPU0]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"] == {
        "memory": {
            "value": f"{GPU_MIB}Mi",
            "requestPolicy": {
                "default": f"{GPU_MIB}Mi",
                "validRange": {"min": "1Mi", "max": f"{GPU_MIB}Mi", "step": "1Mi"},
            },
        },
        "shares": {
            "value": "4",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
        },
    }


def test_mig_instances_and_the_basic_model_and_the_default_share_nothing(host: Host) -> None:
    assert "allowMultipleAllocations" not in _devices(host, 4)[MIG71]
    basic = _devices(host, 4, "basic")[GPU0]
    assert "allowMultipleAllocations" not in basic
    assert basic["capacity"] == {"memory": {"value": f"{GPU_MIB}Mi"}}
    d = host.discovery
    plain = build_slices(build_devices(d.interfaces or [], d.accelerators or []), NODE)
    gpu = next(x for s in plain.slices for x in s["spec"]["devices"] if x["name"] == GPU0)
    assert "allowMultipleAllocations" not in gpu
    assert gpu["capacity"] == {"memory": {"value": f"{GPU_MIB}Mi"}}


@pytest.mark.parametrize("shares", ["1", "-2"])
def test_gpu_shares_of_one_or_below_zero_are_refused_at_start(shares: str) -> None:
    args = build_parser().parse_args(["kubelet-plugin", "--node-name", "n", "--gpu-shares", shares])
    with pytest.raises(
        UsageError, match=f"GPU shares must be 0 .GPUs not shared. or at least 2, not {shares}"
    ):
        build_config(args)


def test_gpu_shares_reach_the_device_config() -> None:
    args = build_parser().parse_args(["kubelet-plugin", "--node-name", "n", "--gpu-shares", "8"])
    assert build_config(args).devices.gpu_shares == 8


# -- prepare ----------------------------------------------------------------------------------


def _spec(node: Node, name: str) -> dict[str, Any]:
    entry = next(e for e in node.driver.checkpoint.entries() if e.name == name)
    return dict(json.loads(Path(entry.cdi_specs[0]).read_text()))


def _gpu_nodes(spec: dict[str, Any]) -> list[str]:
    return [
        n["path"]
        for d in spec["devices"]
        for n in d["containerEdits"].get("deviceNodes", [])
        if n["path"].startswith("/dev/nvidia") and n["path"][11:].isdigit()
    ]


def test_every_sharer_gets_the_same_gpu(node: Node) -> None:
    assert node.prepare("a", share(0, memory="2Gi", shares="1")) == ""
    assert node.prepare("b", share(1, memory="2Gi", shares="1")) == ""
    assert _gpu_nodes(_spec(node, "a")) == _gpu_nodes(_spec(node, "b")) == ["/dev/nvidia0"]
    records = {e.name: e.devices[0] for e in node.driver.checkpoint.entries() if e.devices}
    assert dict(records["a"].consumed or ()) == {"memory": 2 * 2**30, "shares": 1}


def test_a_share_over_what_is_left_of_the_gpu_is_refused(node: Node) -> None:
    assert node.prepare("big", share(0, memory="80000Mi", shares="1")) == ""
    error = node.prepare("more", share(1, memory="2Gi", shares="1"))
    assert f"device {GPU0} (request gpu) was allocated as a share" in error
    assert f"already prepared on it consume 80000Mi, more than the GPU's total {GPU_MIB}Mi" in (
        error
    )
    assert node.prepare("fits", share(2, memory="1559Mi", shares="1")) == ""


def test_shares_bound_the_number_of_sharers(node: Node) -> None:
    for k in range(4):
        assert node.prepare(f"s{k}", share(k, memory="1Gi", shares="1")) == ""
    error = node.prepare("fifth", share(4, memory="1Gi", shares="1"))
    assert "it consumes shares 1 and the 4 share(s) already prepared on it consume 4" in error


def test_a_consumed_capacity_over_the_gpus_total_is_refused(node: Node) -> None:
    error = node.prepare("huge", share(0, memory="100Gi", shares="1"))
    assert f"it consumes memory 102400Mi, over the GPU's total {GPU_MIB}Mi" in error
    error = node.prepare("many", share(1, memory="1Gi", shares="5"))
    assert "it consumes shares 5, over the GPU's total 4" in error
    error = node.prepare("odd", share(2, memory="1Gi", holders="1"))
    assert "consumes holders 1, a capacity this GPU does not offer" in error
    assert "not a quantity" in node.prepare("bad", share(3, memory="lots"))
    assert node.driver.checkpoint.entries() == []


def test_a_share_without_a_consumed_capacity_counts_as_the_whole_gpu(node: Node) -> None:
    assert node.prepare("whole", res("gpu", GPU0, shareID=SHARE[0])) == ""
    error = node.prepare("next", share(1, memory="1Gi", shares="1"))
    assert f"consume {GPU_MIB}Mi, more than the GPU's total" in error


def test_an_exclusive_holder_and_a_sharer_never_meet(tmp_path: Path, host: Host) -> None:
    # Held whole before sharing was turned on: a share is refused beside it, and the other way.
    d = host.discovery
    node = Node(tmp_path, host, build_devices(d.interfaces or [], d.accelerators or []))
    assert node.prepare("excl", res("gpu", GPU0)) == ""
    node.inventory = shared_inventory(host)
    assert "exclusively; a share cannot be added" in node.prepare("s", share(0, memory="1Gi"))
    assert node.prepare("s1", res("gpu", "gpu-0000-3a-00-0", shareID=SHARE[2])) == ""
    error = node.prepare("excl2", res("gpu", "gpu-0000-3a-00-0"))
    assert "as a share; this claim was allocated it exclusively" in error


def test_a_share_of_a_gpu_no_longer_offered_shared_is_refused(tmp_path: Path, host: Host) -> None:
    d = host.discovery
    node = Node(tmp_path, host, build_devices(d.interfaces or [], d.accelerators or []))
    error = node.prepare("late", share(0, memory="1Gi", shares="1"))
    assert "does not offer it shared (its RDMA mode or GPU sharing changed since" in error


# -- sharing strategies -----------------------------------------------------------------------


def _with_config(node: Node, name: str, params: Any, *results: dict[str, Any]) -> str:
    ref = node.store.add(name, results)
    devices = node.store.claims[("ns", name)]["status"]["allocation"]["devices"]
    devices["config"] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": "devices.fabricdra.io", "parameters": params},
        }
    ]
    try:
        node.driver.prepare(ref)
    except Exception as e:
        return str(e)
    return ""


def gpu_config(sharing: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.fabricdra.io/v1beta1",
        "kind": "GpuConfig",
        "sharing": sharing,
    }


def test_mps_points_the_container_at_the_mps_daemon_with_its_limits(node: Node) -> None:
    mps = gpu_config(
        {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
            },
        }
    )
    assert _with_config(node, "mps", mps, share(0, memory="10Gi", shares="1")) == ""
    spec = _spec(node, "mps")
    sharing = next(d for d in spec["devices"] if d["name"].startswith("sharing-"))
    assert sharing["containerEdits"] == {
        "env": [
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
        ],
        "mounts": [
            {
                "hostPath": "/tmp/nvidia-mps",
                "containerPath": "/tmp/nvidia-mps",
                "options": ["rbind", "rw"],
            }
        ],
    }
    entry = next(e for e in node.driver.checkpoint.entries() if e.name == "mps")
    assert entry.devices is not None
    assert f"k8s.devices.fabricdra.io/device={sharing['name']}" in entry.devices[0].cdi_device_ids


def test_time_slicing_at_the_default_interval_adds_nothing(node: Node) -> None:
    ts = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}})
    assert _with_config(node, "ts", ts, share(0, memory="1Gi", shares="1")) == ""
    assert not [d for d in _spec(node, "ts")["devices"] if d["name"].startswith("sharing-")]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
            "time-slice interval Long would change the GPU's compute policy",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}),
            "defaultActiveThreadPercentage must be an integer 1..100, not 0",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "x"}}),
            "defaultPinnedDeviceMemoryLimit must be a positive quantity (e.g. 10Gi), not 'x'",
        ),
        (gpu_config({"strategy": "Spatial"}), "strategy must be TimeSlicing or MPS, not 'Spatial'"),
        (
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
            "apiVersion 'resource.nvidia.com/v1beta1' kind 'GpuConfig' is not understood",
        ),
    ],
)
def test_a_sharing_config_that_cannot_be_honoured_is_refused(
    node: Node, params: dict[str, Any], message: str
) -> None:
    error = _with_config(node, "bad", params, share(0, memory="1Gi", shares="1"))
    assert "opaque configuration for driver devices.fabricdra.io (source FromClaim" in error
    assert message in error
    assert node.driver.checkpoint.entries() == []


def test_a_sharing_strategy_on_a_mig_instance_is_refused(node: Node) -> None:
    ts = gpu_config({"strategy": "TimeSlicing"})
    error = _with_config(node, "mig", ts, res("gpu", MIG71))
    assert "a GpuConfig sharing strategy applies to whole NVIDIA GPUs only" in error


def test_quantities_round_up() -> None:
    from fabricdra.kubeletplugin.kinds.nvidia import gpusharing

    assert gpusharing.parse_quantity("2Gi") == 2 * 2**30
    assert gpusharing.parse_quantity("1500m") == 2
    assert gpusharing.parse_quantity("1e3") == 1000
    assert gpusharing.parse_quantity("1.5Ki") == 1536
    with pytest.raises(ValueError, match="not a quantity"):
        gpusharing.parse_quantity("2 GB")
