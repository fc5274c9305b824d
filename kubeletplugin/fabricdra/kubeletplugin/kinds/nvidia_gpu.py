"""NVIDIA GPU, whole (`type: gpu`): built from discovery's accelerator records of vendor
0x10de bound to `nvidia`; health from NVML/DCGM (health.py); served as the NVIDIA container
toolkit's CDI device where its spec is on the host (driver libraries then come the supported
way), else its device nodes (`/dev/nvidiaN`, `/dev/nvidiactl`, UVM) and nothing else."""

from __future__ import annotations

from collections.abc import Mapping

from ..devices import Device
from ..kubelet import PrepareError
from .accelerator import GPUS, NVIDIA, accelerator_values, gpu_taint_value, vendor_devices
from .base import BuildInputs, PrepareContext, Served, Value, device_nodes


class NvidiaGpu:
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

    def counts(self, device: Device) -> Mapping[str, int]:
        return {}

    def taint_value(self, device: Device) -> str:
        return gpu_taint_value(device)

    def nccl_hca(self, device: Device) -> str | None:
        return None

    def within(self, device: Device) -> str | None:
        return None

    def netdev(self, device: Device) -> str | None:
        return None

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
