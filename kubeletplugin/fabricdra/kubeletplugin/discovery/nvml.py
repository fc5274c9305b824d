"""NVIDIA details from NVML, live (nvidia-ml-py) or from a recorded snapshot.

A snapshot is a JSON object keyed by PCI bus id (`0000:1b:00.0`) whose values carry at least
`uuid`, `name`, `memoryTotalMiB`, `migMode` and `fabric {clusterUuid, cliqueId, state, status}`,
with state/status in NVML's words. Optional, where NVML offers them: the identity users select
on (`driverVersion`, `cudaDriverVersion` as NVML's integer, e.g. 12040, `cudaComputeCapability`
"9.0", `architecture`, `brand`), per-MIG-instance compute capacities (`multiprocessors`,
`copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`) and GPU instance
placement (`placementStart`, the first memory slice: what dynamic MIG adopts it at), health inputs
(`eccUncorrectable`, `xidErrors` seen, `rowRemapFailure`, `rowRemapPending`,
`pcieReplayCounter`, `nvlinkErrors`; `thermalViolation` is recorded but judges nothing) and
the NVLink links (`nvlinks`: state, and for an active link the remote end's PCI bus id and
type, GPU or NVSwitch, from which discovery/nvlink.py groups the GPUs that reach each other).
`fabricdra nvml-snapshot` records one on a GPU host, so
hosts without GPUs (CI, laptops) can replay a real machine's answers.

Xid errors are NVML *events*, not readings: `LiveXidEvents` holds one event set open (the
node agent keeps it for its life) and drains it without blocking; `ReplayedXidEvents` plays
back what a snapshot recorded (`xidEventsSupported`, `xidEventsReason`, and `xidEvents`, in
the order they arrived, each delivered once; a test appends to the file to make one arrive).
Both answer the same two questions, so the consumer (`kubeletplugin/xids.py`) is the same code
on hardware and off it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

# Records, not pydantic models: `fabricdra inventory --sample` reads a snapshot, and importing
# pydantic for it was most of that command's start-up (api/records.py). pydantic still
# validates a snapshot whose values are not already of their fields' types.
from fabricdra.api.records import Field, Record, first_error

FabricState = Literal["completed", "in_progress", "not_started", "not_supported"]
_STATES: dict[int, FabricState] = {
    0: "not_supported",
    1: "not_started",
    2: "in_progress",
    3: "completed",
}


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


NvLinkRemote = Literal["gpu", "switch", "ibmnpu", "unknown"]
_REMOTE_TYPES: dict[int, NvLinkRemote] = {0: "gpu", 1: "ibmnpu", 2: "switch"}


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
    # Health inputs (optional): uncorrectable ECC since boot, critical Xid errors seen,
    # row remapping, and the link error counters (cumulative); active thermal slowdown is
    # recorded but is not a fault (the GPU protects itself and recovers).
    eccUncorrectable: int | None = None
    xidErrors: list[int] | None = None
    rowRemapFailure: bool | None = None
    rowRemapPending: bool | None = None
    pcieReplayCounter: int | None = None
    nvlinkErrors: int | None = None
    thermalViolation: bool | None = None
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


def load_snapshot(path: str | Path) -> NvmlReadings:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
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


def status_name(code: int) -> str:
    """NVML return code -> `success` or the lowercase error name (`not_ready`, …)."""
    if code == 0:
        return "success"
    import pynvml

    for attr in dir(pynvml):
        if attr.startswith("NVML_ERROR_") and getattr(pynvml, attr) == code:
            return attr[len("NVML_ERROR_") :].lower()
    return f"error_{code}"


def read_live() -> NvmlReadings:
    """Ask the NVML library. Never raises: a library that will not load is a reading."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        return NvmlReadings(source="library", available=False, reason=f"nvidia-ml-py: {e}")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return NvmlReadings(source="library", available=False, reason=f"nvmlInit: {e}")
    gpus: dict[str, SnapshotGpu] = {}
    errors: dict[str, str] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                bus = normalise_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
            except pynvml.NVMLError:
                # A GPU that cannot even name its bus (lost): the others are still read, and
                # health finds it as a GPU the kernel has but NVML does not report.
                continue
            try:
                gpus[bus] = SnapshotGpu.model_validate(_read_gpu(pynvml, handle))
            except pynvml.NVMLError as e:  # e.g. GPU_IS_LOST: a fault, not an absence
                errors[bus] = str(e)
    except pynvml.NVMLError as e:
        return NvmlReadings(source="library", available=False, reason=f"enumeration: {e}")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return NvmlReadings(source="library", available=True, gpus=gpus, errors=errors)


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _read_gpu(pynvml: Any, handle: Any) -> dict[str, Any]:
    mig_mode = False
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        mig_mode = current == pynvml.NVML_DEVICE_MIG_ENABLE
    except pynvml.NVMLError_NotSupported:
        pass
    out: dict[str, Any] = {
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "memoryTotalMiB": pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
        "migMode": mig_mode,
        "fabric": _read_fabric(pynvml, handle),
        "migDevices": _read_mig(pynvml, handle) if mig_mode else [],
    }
    out.update(_read_identity(pynvml, handle))
    out.update(_read_health(pynvml, handle))
    out["nvlinks"] = _read_nvlinks(pynvml, handle)
    return out


def _read_nvlinks(pynvml: Any, handle: Any) -> list[dict[str, Any]] | None:
    """Every NVLink link NVML knows of and whether it is active; None when the GPU or driver
    does not answer (the verification probe then says NotRun, not "no links")."""
    links: list[dict[str, Any]] = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue  # no such link on this GPU
        except pynvml.NVMLError:
            return None
        active = state == pynvml.NVML_FEATURE_ENABLED
        entry: dict[str, Any] = {"link": link, "active": active}
        if active:
            entry.update(_read_nvlink_remote(pynvml, handle, link))
        links.append(entry)
    return links or None


def _read_nvlink_remote(pynvml: Any, handle: Any, link: int) -> dict[str, Any]:
    """The far end of an active link, each fact only when NVML answers (older drivers lack
    the device-type call)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(pynvml.NVMLError, AttributeError, ValueError):
        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        out["remoteBusId"] = normalise_bus_id(_text(remote.busId))
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        kind = int(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        out["remoteType"] = _REMOTE_TYPES.get(kind, "unknown")
    return out


_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}
_BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}


def _read_identity(pynvml: Any, handle: Any) -> dict[str, Any]:
    """Each fact only when NVML answers (older drivers lack some calls)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        out["driverVersion"] = _text(pynvml.nvmlSystemGetDriverVersion())
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        out["cudaDriverVersion"] = int(pynvml.nvmlSystemGetCudaDriverVersion())
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        out["cudaComputeCapability"] = f"{int(major)}.{int(minor)}"
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        arch = int(pynvml.nvmlDeviceGetArchitecture(handle))
        if arch in _ARCHITECTURES:
            out["architecture"] = _ARCHITECTURES[arch]
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        brand = int(pynvml.nvmlDeviceGetBrand(handle))
        if brand in _BRANDS:
            out["brand"] = _BRANDS[brand]
    return out


def _read_fabric(pynvml: Any, handle: Any) -> dict[str, Any] | None:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    try:
        # By reference: pynvml hands the argument to ctypes as it is, and a Structure passed
        # by value is read by NVML as a pointer (a segmentation fault on a real H200, driver
        # 580.159.04: docs/gpu-checks.md).
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        # Drivers without the call behave like a GPU with no fabric.
        return {
            "clusterUuid": None,
            "cliqueId": None,
            "state": "not_supported",
            "status": "success",
        }
    return {
        "clusterUuid": bytes(info.clusterUuid).hex(),
        "cliqueId": int(info.cliqueId),
        "state": _STATES.get(int(info.state), "not_supported"),
        "status": status_name(int(info.status)),
    }


def _read_mig(pynvml: Any, handle: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError_NotFound:
            continue
        out.append(
            {
                "uuid": _text(pynvml.nvmlDeviceGetUUID(mig)),
                "name": _text(pynvml.nvmlDeviceGetName(mig)),
                "memoryTotalMiB": pynvml.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024),
                "gpuInstanceId": pynvml.nvmlDeviceGetGpuInstanceId(mig),
                "computeInstanceId": pynvml.nvmlDeviceGetComputeInstanceId(mig),
                **_read_mig_capacities(pynvml, mig),
                **_read_placement(pynvml, handle, mig),
            }
        )
    return out


def _read_placement(pynvml: Any, handle: Any, mig: Any) -> dict[str, Any]:
    """The GPU instance's placement start; nothing where NVML does not say (dynamic MIG then
    leaves the GPU static)."""
    try:
        gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, pynvml.nvmlDeviceGetGpuInstanceId(mig))
        return {"placementStart": int(pynvml.nvmlGpuInstanceGetInfo(gi).placement.start)}
    except (pynvml.NVMLError, AttributeError):
        return {}


def _read_mig_capacities(pynvml: Any, mig: Any) -> dict[str, Any]:
    try:
        a = pynvml.nvmlDeviceGetAttributes(mig)
    except (pynvml.NVMLError, AttributeError):
        return {}
    return {
        "multiprocessors": int(a.multiprocessorCount),
        "copyEngines": int(a.sharedCopyEngineCount),
        "decoders": int(a.sharedDecoderCount),
        "encoders": int(a.sharedEncoderCount),
        "jpegEngines": int(a.sharedJpegCount),
        "ofaEngines": int(a.sharedOfaCount),
    }


def _read_health(pynvml: Any, handle: Any) -> dict[str, Any]:
    """Uncorrectable (double-bit) volatile ECC errors, row remapping, PCIe replays, NVLink
    error counters and active thermal slowdown, each only when the GPU answers; a GPU that
    cannot say is not reported healthy or unhealthy here. (Xid errors arrive as NVML events,
    drained from the event set `LiveXidEvents` holds, see kubeletplugin/xids.py.)"""
    out: dict[str, Any] = {}
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        _corr, _unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
        out["rowRemapPending"] = bool(pending)
        out["rowRemapFailure"] = bool(failure)
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        out["pcieReplayCounter"] = int(pynvml.nvmlDeviceGetPcieReplayCounter(handle))
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        out["nvlinkErrors"] = _nvlink_errors(pynvml, handle)
    with contextlib.suppress(pynvml.NVMLError):
        out["eccUncorrectable"] = int(
            pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        )
    try:
        reasons = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        thermal = (
            pynvml.nvmlClocksEventReasonSwThermalSlowdown
            | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        )
        out["thermalViolation"] = bool(reasons & thermal)
    except (pynvml.NVMLError, AttributeError):
        pass
    return out


def _nvlink_errors(pynvml: Any, handle: Any) -> int:
    """Replay + recovery + CRC errors over the GPU's links (cumulative since boot)."""
    total = 0
    kinds = (
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    )
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
        except pynvml.NVMLError:
            continue
        for kind in kinds:
            with contextlib.suppress(pynvml.NVMLError):
                total += int(pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, kind))
    return total


# -- Xid events --------------------------------------------------------------------------

_NO_INSTANCE = 0xFFFFFFFF  # NVML's "not inside a MIG instance"
MAX_EVENTS_PER_DRAIN = 4096  # a storm must not hold a pass forever: the rest wait a pass


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One Xid event. `bus` None: NVML could not say which GPU it came from."""

    bus: str | None
    xid: int
    gpu_instance: int | None = None
    compute_instance: int | None = None


class XidEventsError(Exception):
    """The event set cannot be created or waited on; the message says why."""


class XidEventSource(Protocol):
    def register(self, buses: Iterable[str]) -> dict[str, str | None]:
        """Register these GPUs for Xid critical errors. For each GPU it could decide: None
        (registered) or why not (e.g. "not supported"); GPUs it cannot decide yet are left
        out and asked again next pass. Raises `XidEventsError` when no event set exists."""
        ...

    def drain(self) -> list[XidEvent]:
        """The events that arrived since the last drain, oldest first, without blocking."""
        ...

    def close(self) -> None: ...


class LiveXidEvents:
    """One NVML event set for the owner's life (as NVIDIA's device plugin does): GPUs are
    registered once for `nvmlEventTypeXidCriticalError`, and `drain` polls the set with a zero
    timeout until it is empty, so a discovery pass never waits on it. The NVML library stays
    initialised while the set is open (NVML counts nvmlInit calls, so the per-pass readings'
    init/shutdown do not close it)."""

    def __init__(self) -> None:
        self._pynvml: Any = None
        self._set: Any = None
        self._failed: str | None = None

    def _open(self) -> Any:
        if self._set is not None:
            return self._set
        if self._failed is not None:
            raise XidEventsError(self._failed)
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            self._failed = f"nvidia-ml-py: {e}"
            raise XidEventsError(self._failed) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:  # no driver here (yet): asked again next pass
            raise XidEventsError(f"nvmlInit: {e}") from None
        try:
            self._set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise XidEventsError(f"nvmlEventSetCreate: {e}") from None
        self._pynvml = pynvml
        return self._set

    def register(self, buses: Iterable[str]) -> dict[str, str | None]:
        event_set = self._open()
        nvml = self._pynvml
        wanted = set(buses)
        out: dict[str, str | None] = {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            raise XidEventsError(f"nvmlDeviceGetCount: {e}") from None
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                bus = normalise_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            except nvml.NVMLError:
                continue  # a lost GPU: health reports it from the readings
            if bus not in wanted:
                continue
            out[bus] = _register(nvml, handle, event_set)
        return out

    def drain(self) -> list[XidEvent]:
        event_set = self._open()
        nvml = self._pynvml
        out: list[XidEvent] = []
        while len(out) < MAX_EVENTS_PER_DRAIN:
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, 0)
            except nvml.NVMLError_Timeout:
                break  # empty
            except nvml.NVMLError as e:
                raise XidEventsError(f"nvmlEventSetWait: {e}") from None
            if not int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                bus: str | None = normalise_bus_id(
                    _text(nvml.nvmlDeviceGetPciInfo(data.device).busId)
                )
            except nvml.NVMLError:
                bus = None
            gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
            out.append(
                XidEvent(
                    bus,
                    int(data.eventData),
                    None if gi == _NO_INSTANCE else gi,
                    None if ci == _NO_INSTANCE else ci,
                )
            )
        return out

    def close(self) -> None:
        if self._set is None:
            return
        nvml, self._set, event_set = self._pynvml, None, self._set
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(event_set)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _register(nvml: Any, handle: Any, event_set: Any) -> str | None:
    """None when the GPU now reports Xid critical errors into `event_set`, else why not."""
    try:
        supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
    except nvml.NVMLError as e:
        return f"supported event types unreadable: {e}"
    if not supported & nvml.nvmlEventTypeXidCriticalError:
        return "the GPU does not report Xid critical-error events"
    try:
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    except nvml.NVMLError_NotSupported:
        return "Xid event registration not supported (GPU or driver too old)"
    except nvml.NVMLError as e:
        return f"Xid event registration failed: {e}"
    return None


class ReplayedXidEvents:
    """Xid events from a recorded snapshot, read afresh on every call: registration answers
    from `xidEventsSupported`/`xidEventsReason` (a GPU without them is left undecided, as an
    older snapshot says nothing about events), events from `xidEvents`, each delivered once
    in the recorded order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._delivered: dict[str, int] = {}

    def _load(self) -> NvmlReadings:
        try:
            return load_snapshot(self.path)
        except SnapshotError as e:
            raise XidEventsError(str(e)) from None

    def register(self, buses: Iterable[str]) -> dict[str, str | None]:
        gpus = self._load().gpus
        out: dict[str, str | None] = {}
        for bus in buses:
            gpu = gpus.get(bus)
            if gpu is None or gpu.xidEventsSupported is None:
                continue
            out[bus] = (
                None
                if gpu.xidEventsSupported
                else gpu.xidEventsReason or "Xid events not supported (recorded)"
            )
        return out

    def drain(self) -> list[XidEvent]:
        out: list[XidEvent] = []
        for bus, gpu in sorted(self._load().gpus.items()):
            events = gpu.xidEvents or []
            for e in events[self._delivered.get(bus, 0) :]:
                out.append(XidEvent(bus, e.xid, e.gpuInstanceId, e.computeInstanceId))
            self._delivered[bus] = len(events)
        return out

    def close(self) -> None:
        pass


def record_xid_events(
    readings: NvmlReadings, seconds: float, source: XidEventSource | None = None
) -> NvmlReadings:
    """`readings` with each GPU's Xid event support and the events that arrived within
    `seconds` (for `fabricdra nvml-snapshot`). A source that cannot open records nothing."""
    source = source or LiveXidEvents()
    gpus = dict(readings.gpus)
    try:
        registered = source.register(gpus)
        events: list[XidEvent] = []
        deadline = time.monotonic() + seconds
        while True:
            events.extend(source.drain())
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    except XidEventsError:
        return readings
    finally:
        source.close()
    for bus, why in registered.items():
        seen = [
            {"xid": e.xid, "gpuInstanceId": e.gpu_instance, "computeInstanceId": e.compute_instance}
            for e in events
            if e.bus == bus
        ]
        gpus[bus] = gpus[bus].model_copy(
            update={
                "xidEventsSupported": why is None,
                "xidEventsReason": why,
                "xidEvents": [SnapshotXidEvent.model_validate(x) for x in seen],
            }
        )
    return dataclasses.replace(readings, gpus=gpus, errors=dict(readings.errors))


def dump_snapshot(readings: NvmlReadings) -> str:
    body: dict[str, Any] = {
        bus: gpu.model_dump(exclude_none=False) for bus, gpu in sorted(readings.gpus.items())
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"
