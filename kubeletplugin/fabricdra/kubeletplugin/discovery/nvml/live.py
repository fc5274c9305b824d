"""NVML asked live through nvidia-ml-py: one pass's readings, never raising (a library that will
not load is a reading). Every fact beyond the required ones is read only where NVML answers."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from .snapshot import FabricState, NvLinkRemote, NvmlReadings, SnapshotGpu, normalise_bus_id

_STATES: dict[int, FabricState] = {
    0: "not_supported",
    1: "not_started",
    2: "in_progress",
    3: "completed",
}
_REMOTE_TYPES: dict[int, NvLinkRemote] = {0: "gpu", 1: "ibmnpu", 2: "switch"}


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
    out.update(_read_recovery_action(pynvml, handle))
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
# NVML_DEVICE_ADDRESSING_MODE_{NONE,HMM,ATS} (nvml.h).
_ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
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


# nvmlDeviceGpuRecoveryAction_t, as nvml.h names the values (NVML_GPU_RECOVERY_ACTION_*).
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def _read_recovery_action(pynvml: Any, handle: Any) -> dict[str, Any]:
    """The recovery action the driver reports, where it does (older drivers: nothing)."""
    with contextlib.suppress(pynvml.NVMLError, AttributeError, IndexError):
        (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [FIELD_RECOVERY_ACTION])
        if int(value.nvmlReturn) == 0:
            action = RECOVERY_ACTIONS.get(int(value.value.uiVal))
            if action is not None:
                return {"recoveryAction": action}
    return {}


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
        # NOT_SUPPORTED where the GPU's memory is no NUMA node (PCIe hosts): nothing recorded.
        node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        if node >= 0:
            out["memoryNumaNodes"] = [node]
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        brand = int(pynvml.nvmlDeviceGetBrand(handle))
        if brand in _BRANDS:
            out["brand"] = _BRANDS[brand]
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        # pynvml passes its versioned structure by reference and returns the mode's value.
        mode = int(pynvml.nvmlDeviceGetAddressingMode(handle))
        if mode in _ADDRESSING_MODES:
            out["addressingMode"] = _ADDRESSING_MODES[mode]
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
