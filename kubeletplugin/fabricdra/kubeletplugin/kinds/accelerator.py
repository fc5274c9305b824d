"""What the accelerator kinds (NVIDIA GPU, NVIDIA MIG instance, AMD GPU) share: how one GPU
becomes devices (whole, or its MIG instances, or dynamic MIG's placements), its health, its
published attributes, and the claim-level CDI device every GPU grant includes. The rules are
in devices.py's docstring; each kind module takes its own devices out of `vendor_devices`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fabricdra.api.deviceclasses import load_device_classes
from fabricdra.api.inventory import Accelerator, MigDevice

from ..devices import (
    LOST_REASON,
    VENDOR_DRIVERS,
    Device,
    GpuHealth,
    GpuInfo,
    Health,
    counter_set_name,
    gpu_name,
    mig_name,
    placement_name,
)
from ..discovery.vendors import NVIDIA
from ..kubelet.cdi import ContainerEdits
from .base import (
    BuildInputs,
    CounterUse,
    DeviceKind,
    PrepareContext,
    Value,
    Version,
    causes_value,
    numa_value,
    pci_values,
)

# The payload lives in its own module (gpusharing.py reads it too); re-exported here, where the
# kinds that build it read it.
from .gpupayload import GpuPayload as GpuPayload
from .gpupayload import gpu_payload as gpu_payload
from .gpupayload import payload_of as payload_of
from .nvidia import gpusharing, migprofiles
from .nvidia.migprofiles import Placement

VOID_GPUS = "NVIDIA_VISIBLE_DEVICES=void"


class GpusGroup:
    """The claim's `gpus-<uid>` CDI device: NVIDIA_VISIBLE_DEVICES=void, so a legacy-mode
    nvidia-container-runtime never honours an image's `NVIDIA_VISIBLE_DEVICES=all`. Per
    device, not spec-wide: a container given only NICs keeps GPUs another source gave it."""

    def device_name(self, claim_uid: str) -> str:
        return f"gpus-{claim_uid}"

    def edits(
        self, ctx: PrepareContext, own_hcas: Sequence[str], hcas: Sequence[str]
    ) -> ContainerEdits:
        return ContainerEdits(env=(VOID_GPUS,))


GPUS = GpusGroup()


def _with(device: Device, **changes: Any) -> Device:
    """`device` with its payload's fields changed."""
    return replace(device, payload=replace(payload_of(device), **changes))


class NvidiaAcceleratorKind(DeviceKind):
    """What NVIDIA's two accelerator kinds share (whole GPU, MIG instance): built from NVML's
    accelerator records of their `device_type`, published with the accelerator attributes,
    tainted by the GPU's causes, and on dynamic MIG drawing on the GPU's counter set."""

    device_type: str
    plugin_group = "nvidia-gpu"
    device_plugin_resources = (
        "nvidia.com/gpu",  # NVIDIA's device plugin (also the GPU Operator's)
        "nvidia.com/gpu.shared",  # its time-slicing/MPS with renameByDefault
        "nvidia.com/mig-*",  # its MIG strategy `mixed`
    )

    def build(self, inputs: BuildInputs) -> list[Device]:
        return [d for d in vendor_devices(inputs, NVIDIA) if d.type == self.device_type]

    def owns(self, device: Device) -> bool:
        p = gpu_payload(device)
        if p is None or device.type != self.device_type:
            return False
        return p.accelerator.vendorId == NVIDIA

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        return accelerator_values(device)

    def taint_value(self, device: Device) -> str:
        return gpu_taint_value(device)

    def counters(self, device: Device) -> CounterUse | None:
        return dynamic_mig_counters(device)

    def consumed(self, device: Device, result: Mapping[str, Any]) -> dict[str, int] | None:
        return gpusharing.consumed(result, device)

    def needs_partitionable(self, device: Device) -> bool:
        # Dynamic MIG's whole GPU and the placements not created yet only exist on a
        # counter set; an adopted or created instance is plain static MIG without one.
        p = payload_of(device)
        return p.dynamic_mig and p.mig is None

    def gone(self, device: Device) -> bool:
        return payload_of(device).lost

    def application_xids(self, device: Device) -> Sequence[int]:
        info = payload_of(device).info
        return info.application_xids if info is not None else ()


def vendor_devices(inputs: BuildInputs, vendor_id: str) -> list[Device]:
    """Every device the GPUs of one PCI vendor offer (whole, MIG, placements), present and
    lost; none where the node does not offer GPUs."""
    config = inputs.config
    if not config.offer_gpus:
        return []
    out: list[Device] = []
    created = frozenset(inputs.created_mig)
    for acc in inputs.accelerators:
        if acc.vendorId != vendor_id:
            continue
        info = inputs.gpu_info.get(acc.pciBusId)
        devices = _accelerator_devices(acc, inputs.gpu_health, info, config.dynamic_mig, created)
        out.extend(_shared(d, config.gpu_shares) if vendor_id == NVIDIA else d for d in devices)
    present = {acc.pciBusId for acc in inputs.accelerators}
    gone = GpuHealth(False, LOST_REASON, ("lost",))
    for acc in inputs.lost:
        if acc.pciBusId in present or acc.vendorId != vendor_id:
            continue
        info = inputs.gpu_info.get(acc.pciBusId)
        out.extend(
            _with(d, lost=True)
            for d in _accelerator_devices(acc, {acc.pciBusId: gone}, info, config.dynamic_mig)
        )
    return out


def _shared(device: Device, shares: int) -> Device:
    """A whole NVIDIA GPU offered to `shares` claims at once (gpusharing.py); MIG instances
    and dynamic MIG's devices stay one claim each."""
    if shares and device.type == "gpu" and not payload_of(device).dynamic_mig:
        return _with(device, shares=shares)
    return device


def _accelerator_devices(
    acc: Accelerator,
    gpu_health: Mapping[str, GpuHealth],
    info: GpuInfo | None,
    dynamic_mig: bool = False,
    created_mig: frozenset[str] = frozenset(),
) -> list[Device]:
    if VENDOR_DRIVERS.get(acc.vendorId, acc.driver) != acc.driver:
        return []  # e.g. vfio-pci (passthrough to a VM): prepare has nothing to hand over
    health, reason = gpu_health_state(gpu_health.get(acc.pciBusId))
    causes = _gpu_causes(gpu_health.get(acc.pciBusId))
    if dynamic_mig and acc.migMode:
        dynamic = _dynamic_mig_devices(acc, info, health, reason, causes, created_mig)
        if dynamic is not None:
            return dynamic
    if not acc.migMode:
        return [_gpu_device(acc, None, info, health, reason, causes)]
    return [_gpu_device(acc, mig, info, health, reason, causes) for mig in acc.migDevices]


def _gpu_device(
    acc: Accelerator,
    mig: MigDevice | None,
    info: GpuInfo | None,
    health: Health,
    reason: str | None,
    causes: tuple[str, ...],
    *,
    dynamic_mig: bool = False,
) -> Device:
    """A whole GPU (`mig` None) or one of its MIG instances, with the GPU's health."""
    return Device(
        name=gpu_name(acc) if mig is None else mig_name(acc, mig),
        type="gpu" if mig is None else "mig",
        health=health,
        health_reason=reason,
        health_causes=causes,
        payload=GpuPayload(acc, mig, info, dynamic_mig=dynamic_mig),
    )


def _dynamic_mig_devices(
    acc: Accelerator,
    info: GpuInfo | None,
    health: Health,
    reason: str | None,
    causes: tuple[str, ...],
    created_mig: frozenset[str] = frozenset(),
) -> list[Device] | None:
    """The whole GPU and every placement of every profile, each consuming its slices of the
    GPU's counter set. Instances that already exist are adopted: offered under their own
    (static) name at their placement, and the placements they overlap (and the whole GPU) are
    not offered, since NVML could not create them. None: this GPU stays static MIG (a model
    the table does not know, or an instance whose profile or placement NVML did not say)."""
    model = migprofiles.model_for(acc.productName, acc.memoryMiB)
    if model is None:
        return None
    adopted: list[tuple[MigDevice, Placement]] = []
    for mig in acc.migDevices:
        profile = model.profile(mig.profile or "")
        start = (info.mig_placements if info else {}).get(mig.uuid)
        if profile is None or start is None or start not in profile.starts:
            return None
        adopted.append((mig, Placement(profile, start)))
    whole = _gpu_device(acc, None, info, health, reason, causes, dynamic_mig=True)
    out = [
        replace(
            _with(whole, mig=mig, placement=p),
            # One we created keeps the name the claim was allocated; an adopted one its own.
            name=placement_name(acc, p) if mig.uuid in created_mig else mig_name(acc, mig),
            type="mig",
        )
        for mig, p in adopted
    ]
    if not adopted:
        out.append(whole)
    for p in model.placements():
        if not any(p.overlaps(q) for _, q in adopted):
            out.append(replace(_with(whole, placement=p), name=placement_name(acc, p), type="mig"))
    return out


def dynamic_mig_counters(device: Device) -> CounterUse | None:
    """Dynamic MIG: the GPU's counter set (its memory and compute slices), of which a profile
    placement draws its slices and the whole GPU all (migprofiles.py); None otherwise."""
    p = payload_of(device)
    if not p.dynamic_mig:
        return None
    used = (
        migprofiles.counters(p.placement)
        if p.placement is not None
        else migprofiles.whole_gpu_counters()
    )
    return CounterUse(counter_set_name(p.accelerator), migprofiles.counter_set(), used)


def gpu_health_state(reading: GpuHealth | None) -> tuple[Health, str | None]:
    """A GPU's health reading as a device's health: no reading is Unknown, never Healthy."""
    if reading is None or reading.healthy is None:
        return "Unknown", (reading.reason if reading else None)
    if reading.healthy:
        return "Healthy", None
    return "Unhealthy", reading.reason or "unhealthy"


def _gpu_causes(reading: GpuHealth | None) -> tuple[str, ...]:
    return reading.causes if reading is not None and reading.healthy is False else ()


def gpu_taint_value(device: Device) -> str:
    """`gpu-ecc`, `gpu-xid-79`, `gpu-ecc.xid-48.xid-79`; `gpu` when no cause is known."""
    return causes_value("gpu", "gpu", device.health_causes)


# --- attributes ----------------------------------------------------------------------------


def accelerator_values(device: Device) -> list[tuple[str, Value]]:
    """A GPU's or MIG instance's attributes, in NVIDIA's DRA driver's names and types
    (docs/attributes.md has the mapping)."""
    p = payload_of(device)
    acc, mig, info, placement = p.accelerator, p.mig, p.info, p.placement
    return [
        ("driverVersion", _version(info.driver_version if info else None)),
        ("cudaDriverVersion", _version(info.cuda_driver_version if info else None)),
        ("cudaComputeCapability", _version(info.cuda_compute_capability if info else None)),
        ("architecture", info.architecture if info else None),
        ("brand", info.brand if info else None),
        ("addressingMode", info.addressing_mode if info else None),
        # A whole GPU's memory NUMA nodes (Grace) join its CPU's node; a MIG instance's memory
        # is one part of it, so it keeps the CPU's node alone (never a node it may not use).
        *pci_values(
            acc.topology,
            acc.pciBusId,
            numa_value(
                acc.numaNode, info.memory_numa_nodes if info and not mig and not placement else ()
            ),
        ),
        ("vendor", acc.vendor),
        ("deviceClass", _device_class(acc, mig, placement)),
        ("productName", (mig.name if mig else None) or _placement_product(acc, placement)),
        # A placement not created yet has no UUID of its own; the GPU's is its parent's.
        ("uuid", mig.uuid if mig else None if placement else acc.uuid),
        ("parentUuid", acc.uuid if mig or placement else None),
        ("migProfile", mig.profile if mig else placement.profile.name if placement else None),
        ("migPlacementStart", placement.start if placement else None),
        ("fabricDomain", acc.topology.fabric.domain if acc.topology.fabric else None),
        # Whole GPUs only: a MIG instance (or placement) has no GPU-to-GPU peer access over
        # NVLink.
        ("nvlinkGroup", info.nvlink_group if info and not mig and not placement else None),
    ]


def _device_class(
    acc: Accelerator, mig: MigDevice | None, placement: Placement | None
) -> str | None:
    if mig is not None:
        return mig.deviceClass
    if placement is None:
        return acc.deviceClass
    # A placement has the MIG class its instance will have (`h100-mig-3g-40gb`), never the
    # whole GPU's: a selector on the GPU's class must not match it.
    classes = load_device_classes()
    parent = next((c for c in classes.classes if c.name == acc.deviceClass), None)
    return classes.mig_class(parent, _placement_product(acc, placement))


def _placement_product(acc: Accelerator, placement: Placement | None) -> str | None:
    # An instance not created yet is named as NVML names one (`... MIG 3g.40gb`).
    if placement is None or acc.productName is None:
        return acc.productName
    return f"{acc.productName} MIG {placement.profile.name}"


def _version(v: str | None) -> Version | None:
    return None if v is None else Version(v)
