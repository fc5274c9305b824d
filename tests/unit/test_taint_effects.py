"""Issue 32 point 3: what a device's taint does. Informative states (health Unknown) carry a
taint with effect `None` that blocks nothing; Unhealthy devices stay `NoSchedule`; with
`--evict-on-fatal` the fatal faults (a GPU lost, uncorrectable memory errors, a reset NVML
asks for) are `NoExecute`, so running pods are evicted. From recorded NVML answers and
kernel-shaped sysfs, through health, devices and the slice builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.devices import GpuHealth
from fabricdra.kubeletplugin.resourceslices import ApiFeatures, build_slices
from tests.unit.test_health_reasons import judged_inventory

GPU = ["gpu-0000-18-00-0", "gpu-0000-3a-00-0", "gpu-0000-4b-00-0", "gpu-0000-5c-00-0"]


def _taints(
    tmp_path: Path,
    edit: dict[int, dict[str, Any]],
    *,
    health: dict[int, GpuHealth] | None = None,
    evict_on_fatal: bool = False,
    features: ApiFeatures | None = None,
) -> dict[str, list[tuple[str, str, str]]]:
    """Device name -> its taints as (key, value, effect), for the devices that carry one."""
    inventory = judged_inventory(tmp_path, edit, health=health)
    plan = build_slices(
        inventory, "n", features=features or ApiFeatures(), evict_on_fatal=evict_on_fatal
    )
    return {
        dev["name"]: [(t["key"], t["value"], t["effect"]) for t in dev["taints"]]
        for s in plan.slices
        for dev in s["spec"].get("devices", [])
        if dev.get("taints")
    }


def test_health_unknown_informs_with_effect_none(tmp_path: Path) -> None:
    taints = _taints(
        tmp_path,
        {0: {"xidEventsSupported": False, "xidEventsReason": "Xid events not supported"}},
    )
    assert taints[GPU[0]] == [("fabricdra.io/health-unknown", "gpu", "None")]
    assert GPU[1] not in taints  # healthy: nothing at all


def test_application_xids_inform_beside_a_fault(tmp_path: Path) -> None:
    taints = _taints(tmp_path, {0: {"xidErrors": [43, 13]}, 1: {"xidErrors": [13, 79]}})
    assert taints[GPU[0]] == [("fabricdra.io/xid", "gpu-xid-13.xid-43", "None")]
    assert taints[GPU[1]] == [
        ("fabricdra.io/unhealthy", "gpu-xid-79", "NoSchedule"),
        ("fabricdra.io/xid", "gpu-xid-13", "None"),
    ]


def test_the_basic_model_has_no_taints_at_all(tmp_path: Path) -> None:
    taints = _taints(tmp_path, {0: {"xidEventsSupported": False}}, features=ApiFeatures("basic"))
    assert taints == {}


def test_fatal_faults_evict_only_when_asked(tmp_path: Path) -> None:
    edit: dict[int, dict[str, Any]] = {
        0: {"eccUncorrectable": 2},  # uncorrectable memory errors: fatal
        1: {"rowRemapPending": True},  # needs a reset, but running work is not lost: not fatal
        2: {"xidErrors": [79]},  # fell off the bus: fatal
    }
    lost = {3: GpuHealth(False, "the GPU left the PCI bus", ("lost",))}
    default = _taints(tmp_path / "a", edit, health=lost)
    assert {name: [t[2] for t in ts] for name, ts in default.items() if name in GPU} == {
        GPU[0]: ["NoSchedule"],
        GPU[1]: ["NoSchedule"],
        GPU[2]: ["NoSchedule"],
        GPU[3]: ["NoSchedule"],
    }
    evicting = _taints(tmp_path / "b", edit, health=lost, evict_on_fatal=True)
    assert evicting[GPU[0]] == [("fabricdra.io/unhealthy", "gpu-ecc", "NoExecute")]
    assert evicting[GPU[1]] == [("fabricdra.io/unhealthy", "gpu-row-remap-pending", "NoSchedule")]
    assert evicting[GPU[2]] == [("fabricdra.io/unhealthy", "gpu-xid-79", "NoExecute")]
    assert evicting[GPU[3]] == [("fabricdra.io/unhealthy", "gpu-lost", "NoExecute")]


def test_nvmls_recovery_action_classifies_the_gpu(tmp_path: Path) -> None:
    """Where the driver reports a recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), a
    reset or reboot it asks for is a fatal fault; a P2P drain is a fault that does not
    evict; `none` adds nothing."""
    taints = _taints(
        tmp_path,
        {
            0: {"xidErrors": [154], "recoveryAction": "gpu_reset"},
            1: {"recoveryAction": "node_reboot"},
            2: {"recoveryAction": "drain_p2p"},
            3: {"recoveryAction": "none"},
        },
        evict_on_fatal=True,
    )
    assert taints[GPU[0]] == [
        ("fabricdra.io/unhealthy", "gpu-xid-154.recovery-gpu-reset", "NoExecute")
    ]
    assert taints[GPU[1]] == [("fabricdra.io/unhealthy", "gpu-recovery-node-reboot", "NoExecute")]
    assert taints[GPU[2]] == [("fabricdra.io/unhealthy", "gpu-recovery-drain-p2p", "NoSchedule")]
    assert GPU[3] not in taints
