"""The recorded form of NVML's answers: the models every NVML reader fills (live or replayed),
the readings of one pass, and the snapshot file's loader and writer (format: nvml/__init__.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

# Records, not pydantic models: `fabricdra inventory --sample` reads a snapshot, and importing
# pydantic for it was most of that command's start-up (api/records.py). pydantic still
# validates a snapshot whose values are not already of their fields' types.
from fabricdra.api.records import Field, Record, first_error

FabricState = Literal["completed", "in_progress", "not_started", "not_supported"]


# Keys a newer recorder writes are tolerated, and dropped.
_TOLERANT: dict[str, Any] = {"extra": "ignore"}


class SnapshotFabric(Record):
    __pydantic_config__: ClassVar[dict[str, Any]] = _TOLERANT

    clusterUuid: str | None = None
    cliqueId: int | None = None
    state: FabricState
    status: str


class SnapshotMigDevice(Record):
    __pydantic_config__: ClassVar[dict[str, Any]] = _TOLERANT

    uuid: str
    name: str | None = None
    memoryTotalMiB: int | None = None
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None
    # Compute capacities of the instance (nvmlDeviceGetAttributes on the MIG handle).
    multiprocessors: int | None = None
    copyEngines: int | None = None
    decoders: int | None = None
    encoders: int | None = None
    jpegEngines: int | None = None
    ofaEngines: int | None = None
    # The GPU instance's placement start (memory slice, nvmlGpuInstanceGetInfo): dynamic MIG
    # adopts an existing instance at it.
    placementStart: int | None = None


AddressingMode = Literal["HMM", "ATS", "None"]
NvLinkRemote = Literal["gpu", "switch", "ibmnpu", "unknown"]


class SnapshotNvLink(Record):
    """One NVLink link's state (nvmlDeviceGetNvLinkState), for the verification probe, and for
    an active link what is at its far end: the remote PCI bus id in sysfs form
    (nvmlDeviceGetNvLinkRemotePciInfo) and the remote device's type
    (nvmlDeviceGetNvLinkRemoteDeviceType: a GPU over a bridge, or an NVSwitch). None: not
    recorded, or NVML did not answer — such a link joins nothing (kubeletplugin/.../nvlink.py)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _TOLERANT

    link: int
    active: bool
    remoteBusId: str | None = None
    remoteType: NvLinkRemote | None = None


class SnapshotXidEvent(Record):
    """One Xid critical-error event as NVML delivered it (nvmlEventSetWait_v2): the Xid
    (`eventData`) and, for an error inside a MIG instance, its GPU/compute instance ids."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _TOLERANT

    xid: int
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None


class SnapshotGpu(Record):
    """NVML's answers for one GPU."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _TOLERANT

    uuid: str
    name: str
    memoryTotalMiB: int
    migMode: bool
    fabric: SnapshotFabric | None = None
    migDevices: list[SnapshotMigDevice] = Field(default_factory=list)
    # Identity users write CEL against (NVIDIA's DRA driver publishes the same facts).
    driverVersion: str | None = None
    cudaDriverVersion: int | None = None  # NVML's form: 1000 * major + 10 * minor
    cudaComputeCapability: str | None = None  # "major.minor"
    architecture: str | None = None
    brand: str | None = None
    # How the GPU reaches system memory (nvmlDeviceGetAddressingMode): "HMM", "ATS" or "None";
    # absent where NVML does not answer (drivers before the call, NotSupported).
    addressingMode: AddressingMode | None = None
    # NUMA nodes holding the GPU's own memory, where the platform onlines it as CPU-less NUMA
    # nodes (Grace: C2C-coherent HBM); None: not recorded or not such a platform.
    memoryNumaNodes: list[int] | None = None
    # Health inputs (optional): uncorrectable ECC since boot, critical Xid errors seen,
    # row remapping, and the link error counters (cumulative); active thermal slowdown is
    # recorded but is not a fault (the GPU protects itself and recovers).
    eccUncorrectable: int | None = None
    xidErrors: list[int] | None = None
    # Application Xids seen since boot (13, 31, 43, 45, 68, 109): informative, never a fault.
    applicationXids: list[int] | None = None
    rowRemapFailure: bool | None = None
    rowRemapPending: bool | None = None
    pcieReplayCounter: int | None = None
    nvlinkErrors: int | None = None
    thermalViolation: bool | None = None
    # What the driver says the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, r550+), in
    # NVML's words: none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, ...; None: the
    # driver does not report it.
    recoveryAction: str | None = None
    # Xid events: whether the GPU accepted a registration for Xid critical errors (None: not
    # recorded), why not, and the events seen while recording (replayed in order, once each).
    xidEventsSupported: bool | None = None
    xidEventsReason: str | None = None
    xidEvents: list[SnapshotXidEvent] | None = None
    # NVLink links as NVML reports them; None: not recorded / not asked (verification: NotRun).
    nvlinks: list[SnapshotNvLink] | None = None


@dataclass(frozen=True, slots=True)
class NvmlReadings:
    """What NVML said this pass. `available` False means the question could not be asked."""

    source: Literal["library", "snapshot"]
    available: bool
    reason: str | None = None
    gpus: dict[str, SnapshotGpu] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # bus id -> why its details are missing


class SnapshotError(Exception):
    """A snapshot file that cannot be used; the message names the file and the problem."""


def normalise_bus_id(bus_id: str) -> str:
    """NVML says `00000000:1B:00.0`; sysfs says `0000:1b:00.0`. Compare in sysfs form."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def load_snapshot(path: str | os.PathLike[str]) -> NvmlReadings:
    p = os.fspath(path)  # os, not pathlib: importing pathlib was ~3 % of inventory start-up
    try:
        with open(p) as f:
            raw = json.load(f)
    except OSError as e:
        raise SnapshotError(f"NVML snapshot {p}: cannot read: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SnapshotError(f"NVML snapshot {p}: not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise SnapshotError(f"NVML snapshot {p}: expected an object keyed by PCI bus id")
    gpus: dict[str, SnapshotGpu] = {}
    for key, value in raw.items():
        if key.startswith("_"):
            continue  # comments and recording metadata
        try:
            gpus[normalise_bus_id(key)] = SnapshotGpu.model_validate(value)
        except ValueError as e:  # pydantic's ValidationError is one
            where, msg = first_error(e)
            raise SnapshotError(
                f"NVML snapshot {p}: entry {key!r}{' field ' + where if where else ''}: {msg}"
            ) from e
    return NvmlReadings(source="snapshot", available=True, gpus=gpus)


def dump_snapshot(readings: NvmlReadings) -> str:
    body: dict[str, Any] = {
        bus: gpu.model_dump(exclude_none=False) for bus, gpu in sorted(readings.gpus.items())
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"
