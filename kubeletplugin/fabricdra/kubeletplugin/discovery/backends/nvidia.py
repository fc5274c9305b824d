"""The NVIDIA backend: NVML's answers (live or a recorded snapshot, discovery/nvml/) as GPU facts,
and the NVLink fabric record NVML's fabric registration establishes."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from fabricdra.api.inventory import Fabric, FabricRegistration

from ..nvml import NvmlReadings, SnapshotGpu, SnapshotMigDevice
from ..sysfs import SysfsTree
from ..vendors import NVIDIA
from .base import Function, GpuFacts, MigFacts

NvmlSource = Callable[[], NvmlReadings]


class NvidiaBackend:
    """Asks `source` (NVML live, or a snapshot's loader) once a pass; with no source (a caller
    that did not ask for NVML) the readings are None and every GPU has only its PCI facts."""

    vendor_id = NVIDIA

    def __init__(self, source: NvmlSource | None = None) -> None:
        self.source = source

    def read(self, tree: SysfsTree, functions: Sequence[Function]) -> NvmlReadings | None:
        return self.source() if self.source is not None else None

    def facts(self, readings: NvmlReadings | None, bus_id: str) -> GpuFacts | None:
        gpu = readings.gpus.get(bus_id) if readings and readings.available else None
        if gpu is None:
            return None
        registration, fabric = nvlink_fabric(gpu)
        return GpuFacts(
            product=gpu.name,
            uuid=gpu.uuid,
            memory_mib=gpu.memoryTotalMiB,
            mig_mode=gpu.migMode,
            mig_devices=tuple(
                MigFacts(
                    uuid=m.uuid,
                    name=m.name,
                    memory_mib=m.memoryTotalMiB,
                    gpu_instance_id=m.gpuInstanceId,
                    compute_instance_id=m.computeInstanceId,
                )
                for m in sorted(gpu.migDevices, key=_mig_order)
            ),
            registration=registration,
            fabric=fabric,
        )

    def fabric_known(self, readings: NvmlReadings | None, bus_id: str) -> tuple[bool, bool]:
        known = readings is not None and readings.available and bus_id in readings.gpus
        return known, known


def _mig_order(m: SnapshotMigDevice) -> tuple[int, int, str]:
    return (m.gpuInstanceId or 0, m.computeInstanceId or 0, m.uuid)


_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def canonical_cluster_uuid(value: str | None) -> str | None:
    """Any UUID spelling -> 32 lowercase hex; None when it is not a UUID."""
    if value is None:
        return None
    h = value.strip().lower().replace("-", "")
    if h.startswith("0x"):
        h = h[2:]
    return h if _HEX32.match(h) else None


def nvlink_fabric(gpu: SnapshotGpu) -> tuple[FabricRegistration | None, Fabric | None]:
    """The fabric record appears only once registration completed without error and named a
    non-zero cluster: an ordinary card answers `not_supported` with zeros, and publishing that
    would put every such machine in one shared domain."""
    f = gpu.fabric
    if f is None:
        return None, None
    cluster = canonical_cluster_uuid(f.clusterUuid)
    registration = FabricRegistration(
        state=f.state, status=f.status, clusterUuid=cluster, cliqueId=f.cliqueId
    )
    ok = f.state == "completed" and f.status.lower() in ("success", "nvml_success")
    if not ok or cluster is None or int(cluster, 16) == 0:
        return registration, None
    clique = f.cliqueId
    domain = f"nvlink-{cluster}" if clique is None else f"nvlink-{cluster}-{clique}"
    return registration, Fabric(kind="nvlink", id=cluster, cliqueId=clique, domain=domain)
