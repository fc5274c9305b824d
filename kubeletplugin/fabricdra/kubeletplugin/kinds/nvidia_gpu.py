"""NVIDIA GPU, whole (`type: gpu`): built from discovery's accelerator records of vendor
0x10de bound to `nvidia`; health from NVML/DCGM (health.py); served as the NVIDIA container
toolkit's CDI device where its spec is on the host (driver libraries then come the supported
way), else its device nodes (`/dev/nvidiaN`, `/dev/nvidiactl`, UVM) and nothing else."""

from __future__ import annotations

from ..devices import Device
from ..kubelet import PrepareError
from .accelerator import (
    GPUS,
    NVIDIA,
    accelerator_values,
    dynamic_mig_counters,
    gpu_taint_value,
    vendor_devices,
)
from .base import BuildInputs, CounterUse, DeviceKind, PrepareContext, Served, Value, device_nodes


class NvidiaGpu(DeviceKind):
    name = "nvidia-gpu"
    device_type = "gpu"

    def build(self, inputs: BuildInputs) -> list[Device]:
        return [d for d in vendor_devices(inputs, NVIDIA) if d.type == "gpu"]

    def owns(self, device: Device) -> bool:
        acc = device.accelerator
        return device.type == "gpu" and acc is not None and acc.vendorId == NVIDIA

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        return accelerator_values(device)

    def memory_mib(self, device: Device) -> int | None:
        return device.accelerator.memoryMiB if device.accelerator is not None else None

    def taint_value(self, device: Device) -> str:
        return gpu_taint_value(device)

    def counters(self, device: Device) -> CounterUse | None:
        return dynamic_mig_counters(device)

    def needs_partitionable(self, device: Device) -> bool:
        # Dynamic MIG's whole GPU and the placements not created yet only exist on a
        # counter set; an adopted or created instance is plain static MIG without one.
        return device.dynamic_mig and device.mig is None

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        acc = device.accelerator
        if acc is None or not self.owns(device):
            raise PrepareError(f"device {device.name} is not a whole NVIDIA GPU")
        minor = ctx.host.nvidia_minor(acc.pciBusId)
        toolkit = ctx.toolkit.gpu_id(acc.uuid, minor)
        if toolkit is not None:
            return Served(toolkit_id=toolkit, group=GPUS)
        return Served(device_nodes(ctx.host.nvidia_gpu_nodes(minor)), group=GPUS)


KIND = NvidiaGpu()
