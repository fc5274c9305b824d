"""NVIDIA MIG instance (`type: mig`): one device per MIG instance of a MIG-mode GPU (static
MIG), or, with dynamic MIG, every profile placement drawing on the GPU's counter set (the
whole dynamic-MIG GPU is the nvidia-gpu kind's). Health is the parent GPU's. Served as the
toolkit's CDI device holding exactly the instance's capability nodes, else the GPU's nodes
plus the instance's two capability nodes; a placement not created yet is created first
(dynamicmig.py). Refused: an instance whose GPU/compute instance ids are unknown."""

from __future__ import annotations

from collections.abc import Mapping

from ..devices import Device, gpu_name, placement_name
from ..kubelet import PrepareError
from ..kubelet.cdi import DeviceNode
from ..kubelet.claims import ensure_wanted
from ..kubelet.driver import current_call
from .accelerator import (
    GPUS,
    NvidiaAcceleratorKind,
    gpu_payload,
    payload_of,
)
from .base import PrepareContext, Served, device_nodes

# Seconds of kubelet's deadline (45 s) a MIG instance's creation is started with at least:
# NVML creates a GPU and compute instance in a few seconds (not measured here: see
# docs/gpu-checks.md), the CDI spec and checkpoint are written after it.
MIG_CREATE_BUDGET = 15.0


class NvidiaMig(NvidiaAcceleratorKind):
    name = "nvidia-mig"
    device_type = "mig"

    def memory_mib(self, device: Device) -> int | None:
        mig = payload_of(device).mig
        return mig.memoryMiB if mig is not None else None

    def counts(self, device: Device) -> Mapping[str, int]:
        """The instance's compute capacities (multiprocessors, copy/decoder/encoder/jpeg/ofa
        engines) as NVML reported them; none where it did not."""
        p = payload_of(device)
        if p.mig is None or p.info is None:
            return {}
        return dict(p.info.mig_capacity.get(p.mig.uuid, {}))

    def within(self, device: Device) -> str | None:
        return gpu_name(payload_of(device).accelerator)

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        p = gpu_payload(device)
        if p is None or not self.owns(device):
            raise PrepareError(f"device {device.name} is not an NVIDIA MIG instance")
        acc = p.accelerator
        minor = ctx.host.nvidia_minor(acc.pciBusId)
        if is_placement(device):
            # The journal, not the last pass, says whether its instance exists: one the
            # inventory still shows may have been destroyed by an unprepare since.
            return Served(device_nodes(_create(device, acc.pciBusId, minor, ctx)), group=GPUS)
        mig = p.mig
        if mig is None:
            raise PrepareError(f"device {device.name} names no MIG instance")
        if mig.gpuInstanceId is None or mig.computeInstanceId is None:
            # Neither its capability nodes nor a toolkit device holding exactly them can be
            # found: anything else could hand over other instances.
            raise PrepareError(
                f"MIG device {device.name}: its GPU/compute instance ids are unknown, so its "
                "device nodes cannot be found or a toolkit CDI device checked against them"
            )
        caps = ctx.host.mig_cap_nodes(minor, mig.gpuInstanceId, mig.computeInstanceId)
        toolkit = (
            ctx.toolkit.mig_id(mig.uuid, minor, [c.path for c in caps])
            if ctx.toolkit is not None
            else None
        )
        if toolkit is not None:
            return Served(toolkit_id=toolkit, group=GPUS)
        return Served(device_nodes([*ctx.host.nvidia_gpu_nodes(minor), *caps]), group=GPUS)


def _create(device: Device, bus: str, minor: int, ctx: PrepareContext) -> list[DeviceNode]:
    """A dynamic MIG placement: its instance, created now (or earlier for this claim), and
    its device nodes. The journal names it before NVML creates it (dynamicmig.py)."""
    placement = payload_of(device).placement
    assert placement is not None
    if ctx.dynamic_mig is None:
        raise PrepareError(f"device {device.name}: dynamic MIG is off on this node")
    try:
        if not _created_for(device, ctx):
            _in_time_to_create(device)  # NVML is to be asked: still wanted, and in time
        made = ctx.dynamic_mig.create(
            ctx.claim_uid,
            device.name,
            bus,
            placement.profile.name,
            placement.start,
        )
    except PrepareError:
        raise
    except Exception as e:  # NVML's errors, and a placement held by another claim
        raise PrepareError(f"device {device.name}: cannot create the MIG instance: {e}") from e
    caps = ctx.host.mig_cap_nodes(minor, made.gpu_instance, made.compute_instance)
    return [*ctx.host.nvidia_gpu_nodes(minor), *caps]


def _created_for(device: Device, ctx: PrepareContext) -> bool:
    """The journal records this claim's instance of the device as created (ids known)."""
    assert ctx.dynamic_mig is not None
    return any(
        r.claim == ctx.claim_uid and r.device == device.name and r.created is not None
        for r in ctx.dynamic_mig.records()
    )


def _in_time_to_create(device: Device) -> None:
    ensure_wanted()
    if current_call().remaining() < MIG_CREATE_BUDGET:
        # Started this late, the answer could come after kubelet gave up; kubelet retries.
        raise PrepareError(
            f"device {device.name}: too little time left before kubelet's deadline to create "
            f"its MIG instance (under {MIG_CREATE_BUDGET:.0f} s)"
        )


def is_placement(device: Device) -> bool:
    """A dynamic MIG placement (created by us or not yet): named after its placement, unlike
    an adopted instance, which keeps its static name."""
    p = gpu_payload(device)
    return (
        p is not None
        and p.dynamic_mig
        and p.placement is not None
        and device.name == placement_name(p.accelerator, p.placement)
    )


KIND = NvidiaMig()
