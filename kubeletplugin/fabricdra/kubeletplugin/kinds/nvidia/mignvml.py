"""The NVML calls of dynamic MIG (`dynamicmig.MigNvml`) on a real GPU, through pynvml.

pynvml hands each argument to the C function as it is given (no argtypes): NVML's
`nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, const nvmlGpuInstancePlacement_t
*placement, nvmlGpuInstance_t *gpuInstance)` reads the placement through a pointer, so it is
passed `byref(...)` — a structure by value would reach NVML as its bytes where it reads an
address (a by-value structure segfaulted `nvmlDeviceGetGpuFabricInfo` on an H200, see
docs/gpu-checks.md). The arrays `nvmlDeviceGetGpuInstances` and
`nvmlGpuInstanceGetComputeInstances` fill are ctypes arrays (passed as pointers) and their
counts `byref`. tests/unit/test_mig_nvml.py runs every call here through the real pynvml
against a C library with NVML's signatures (tests/nvmlfake/libnvml_mig.c).

Creating needs MIG mode on (never switched here: that is the administrator's, and needs a GPU
reset) and root or CAP_SYS_ADMIN (the agent's container is privileged). Each call opens and
closes its own NVML session (NVML counts nvmlInit calls, so the Xid event set stays open).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from ctypes import byref, c_uint
from typing import Any

import structlog

from . import migprofiles
from .dynamicmig import DynamicMigError, Instance, MigLeftBehind

log = structlog.get_logger("fabricdra.mignvml")

MIB = 1024 * 1024

# Our table's profiles (compute slices, memory slices) -> NVML's GPU instance profile constant
# (nvml.h), the same mapping e2e/gpu/dynamic_mig_check.py compares on a real GPU.
GI_PROFILES = {
    (1, 1): "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    (1, 2): "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    (2, 2): "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    (3, 4): "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    (4, 4): "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    (7, 8): "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
}
# The one compute instance filling a GPU instance of N compute slices (what `nvidia-smi mig
# -cgi <profile> -C` creates).
CI_PROFILES = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
}
NO_COMPUTE_INSTANCE = -1  # a GPU instance whose compute instance was never made


class LiveMigNvml:
    """`MigNvml` over the NVML library. `nvml`: the pynvml module (imported when first used)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()  # one MIG change at a time on this node

    def _lib(self) -> Any:
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        return self._nvml

    @contextmanager
    def _gpu(self, bus: str) -> Iterator[tuple[Any, Any, migprofiles.Model]]:
        nvml = self._lib()
        with self._lock:
            nvml.nvmlInit()
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(bus.encode())
                name = _text(nvml.nvmlDeviceGetName(handle))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
                model = migprofiles.model_for(name, memory)
                if model is None:
                    raise DynamicMigError(f"GPU {bus} ({name}, {memory} MiB) has no MIG table")
                yield nvml, handle, model
            finally:
                nvml.nvmlShutdown()

    def create(self, bus: str, profile: str, start: int) -> Instance:
        with self._gpu(bus) as (nvml, handle, model):
            p = model.profile(profile)
            if p is None or start not in p.starts:
                raise DynamicMigError(f"{model.key} has no MIG placement {profile} at {start}")
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(
                handle, getattr(nvml, GI_PROFILES[(p.compute, p.size)])
            )
            placement = nvml.c_nvmlGpuInstancePlacement_t(start, p.size)
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, byref(placement))
            try:
                ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi,
                    getattr(nvml, CI_PROFILES[p.compute]),
                    nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
                gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
                ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
                uuid = _mig_uuid(nvml, handle, gi_id, ci_id)
            except Exception as e:
                # Nothing half-made stays: the GPU instance goes, with any compute instance.
                try:
                    _destroy(nvml, gi)
                except Exception as cleanup:
                    log.error(
                        "a half-made MIG instance could not be destroyed",
                        bus=bus,
                        profile=profile,
                        start=start,
                        error=str(cleanup),
                    )
                    raise MigLeftBehind(f"{e}; destroying the GPU instance: {cleanup}") from e
                raise
            return Instance(gi_id, ci_id, uuid, profile, start)

    def destroy(self, bus: str, gpu_instance: int) -> None:
        with self._gpu(bus) as (nvml, handle, _):
            try:
                gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance)
            except nvml.NVMLError_NotFound:
                return  # gone already
            _destroy(nvml, gi)

    def instances(self, bus: str) -> list[Instance]:
        """Every GPU instance of a profile our table has, with its compute instance (if any)
        and MIG device UUID."""
        out = []
        with self._gpu(bus) as (nvml, handle, model):
            for p in model.profiles:
                try:
                    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(
                        handle, getattr(nvml, GI_PROFILES[(p.compute, p.size)])
                    )
                except nvml.NVMLError:
                    continue
                for gi in _gpu_instances(nvml, handle, info):
                    gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
                    gi_id = int(gi_info.id)
                    cis = _compute_instances(nvml, gi)
                    ci_id = int(nvml.nvmlComputeInstanceGetInfo(cis[0]).id) if cis else None
                    uuid = "" if ci_id is None else _mig_uuid(nvml, handle, gi_id, ci_id)
                    out.append(
                        Instance(
                            gi_id,
                            NO_COMPUTE_INSTANCE if ci_id is None else ci_id,
                            uuid,
                            p.name,
                            int(gi_info.placement.start),
                        )
                    )
        return out


def _gpu_instances(nvml: Any, handle: Any, info: Any) -> list[Any]:
    room = max(int(info.instanceCount), 1)
    found = (nvml.c_nvmlGpuInstance_t * room)()
    count = c_uint(room)
    nvml.nvmlDeviceGetGpuInstances(handle, info.id, found, byref(count))
    return [found[k] for k in range(count.value)]


def _compute_instances(nvml: Any, gi: Any) -> list[Any]:
    out: list[Any] = []
    for const in CI_PROFILES.values():
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, getattr(nvml, const), nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except nvml.NVMLError:
            continue  # larger than this GPU instance
        room = max(int(info.instanceCount), 1)
        found = (nvml.c_nvmlComputeInstance_t * room)()
        count = c_uint(room)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, found, byref(count))
        out.extend(found[k] for k in range(count.value))
    return out


def _destroy(nvml: Any, gi: Any) -> None:
    """A GPU instance: its compute instances first (NVML refuses it while they exist)."""
    for ci in _compute_instances(nvml, gi):
        nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)


def _mig_uuid(nvml: Any, handle: Any, gi_id: int, ci_id: int) -> str:
    for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nvml.NVMLError_NotFound:
            continue
        ids = (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig))
        if ids == (gi_id, ci_id):
            return _text(nvml.nvmlDeviceGetUUID(mig))
    raise DynamicMigError(f"NVML lists no MIG device for gi{gi_id}/ci{ci_id}")


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
