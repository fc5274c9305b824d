"""NVIDIA GPU, whole (`type: gpu`): built from discovery's accelerator records of vendor
0x10de bound to `nvidia`; health from NVML/DCGM (health.py); served as the NVIDIA container
toolkit's CDI device where its spec is on the host (driver libraries then come the supported
way), else its device nodes (`/dev/nvidiaN`, `/dev/nvidiactl`, UVM) and nothing else."""

from __future__ import annotations

from ..devices import Device
from ..kubelet import PrepareError
from .accelerator import GPUS, NvidiaAcceleratorKind, gpu_payload, payload_of
from .base import PrepareContext, Served, device_nodes


class NvidiaGpu(NvidiaAcceleratorKind):
    name = "nvidia-gpu"
    device_type = "gpu"

    def memory_mib(self, device: Device) -> int | None:
        return payload_of(device).accelerator.memoryMiB

    def shareable(self, device: Device) -> bool:
        return payload_of(device).shares > 0

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        p = gpu_payload(device)
        if p is None or not self.owns(device):
            raise PrepareError(f"device {device.name} is not a whole NVIDIA GPU")
        acc = p.accelerator
        minor = ctx.host.nvidia_minor(acc.pciBusId)
        toolkit = ctx.toolkit.gpu_id(acc.uuid, minor) if ctx.toolkit is not None else None
        if toolkit is not None:
            return Served(toolkit_id=toolkit, group=GPUS)
        return Served(device_nodes(ctx.host.nvidia_gpu_nodes(minor)), group=GPUS)


KIND = NvidiaGpu()
