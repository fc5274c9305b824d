"""AMD GPU, whole (`type: gpu`): built from discovery's accelerator records of vendor 0x1002
bound to `amdgpu`; health from its RAS error counts (health.py `amd_health`). Served as
`/dev/kfd` and the GPU's own `/dev/dri/renderDN`."""

from __future__ import annotations

from ..devices import Device, gpu_name
from ..discovery.vendors import AMD
from ..kubelet import PrepareError
from .accelerator import (
    GPUS,
    accelerator_values,
    gpu_payload,
    gpu_taint_value,
    payload_of,
    vendor_devices,
)
from .base import BuildInputs, DeviceKind, PrepareContext, Served, Value, device_nodes


class AmdGpu(DeviceKind):
    name = "amd-gpu"
    device_type = "gpu"
    plugin_group = "amd-gpu"
    device_plugin_resources = ("amd.com/gpu",)  # AMD's device plugin (and AMD's GPU Operator)

    def build(self, inputs: BuildInputs) -> list[Device]:
        return vendor_devices(inputs, AMD)

    def owns(self, device: Device) -> bool:
        p = gpu_payload(device)
        return device.type in ("gpu", "mig") and p is not None and p.accelerator.vendorId == AMD

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        return accelerator_values(device)

    def memory_mib(self, device: Device) -> int | None:
        p = payload_of(device)
        return p.mig.memoryMiB if p.mig is not None else p.accelerator.memoryMiB

    def taint_value(self, device: Device) -> str:
        return gpu_taint_value(device)

    def gone(self, device: Device) -> bool:
        return payload_of(device).lost

    def within(self, device: Device) -> str | None:
        return gpu_name(payload_of(device).accelerator) if device.type == "mig" else None

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        p = gpu_payload(device)
        if p is None or device.type != "gpu" or not self.owns(device):
            raise PrepareError(f"device {device.name}: only whole AMD GPUs can be prepared")
        return Served(device_nodes(ctx.host.amd_gpu_nodes(p.accelerator.pciBusId)), group=GPUS)


KIND = AmdGpu()
