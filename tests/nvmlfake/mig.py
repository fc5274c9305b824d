"""A fake NVML MIG GPU: GPU instances are created and destroyed under the real placement rules
of one GPU model, read from what the GPU itself prints (`nvidia-smi mig -lgip` for the profiles
and `nvidia-smi mig -lgipp` for their placements), not from the table under test.

The H100 80GB HBM3 answers below are those NVIDIA's MIG user guide shows for the H100
("Supported MIG Profiles", H100 placements:
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# `nvidia-smi mig -lgip`: profile id, name, compute slices (SMs fraction of 7).
H100_80GB_PROFILES = {
    19: ("1g.10gb", 1),
    20: ("1g.10gb+me", 1),
    15: ("1g.20gb", 1),
    14: ("2g.20gb", 2),
    9: ("3g.40gb", 3),
    5: ("4g.40gb", 4),
    0: ("7g.80gb", 7),
}

# `nvidia-smi mig -lgipp` on an H100 80GB HBM3 with MIG mode on and no instances.
H100_80GB_LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""

# Recorded on an NVIDIA H200 (143771 MiB, driver 580.159.04, MIG mode off) with `nvidia-smi mig
# -lgip` (name, id, SMs/CE... trimmed to name and compute slices = the "Ng") and `-lgipp`: the
# same placements as the H100, with the H200's memory in the names.
H200_141GB_PROFILES = {
    19: ("1g.18gb", 1),
    20: ("1g.18gb+me", 1),
    15: ("1g.35gb", 1),
    14: ("2g.35gb", 2),
    9: ("3g.71gb", 3),
    5: ("4g.71gb", 4),
    0: ("7g.141gb", 7),
}
H200_141GB_LGIPP = H100_80GB_LGIPP  # byte for byte what the H200 printed

# NVML's GPU instance profile constants (nvml.h NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0,
# _2_SLICE = 1, _3_SLICE = 2, _4_SLICE = 3, _7_SLICE = 4, _1_SLICE_REV1 = 7, _1_SLICE_REV2 = 9)
# -> the profile id nvmlDeviceGetGpuInstanceProfileInfo answers for them, the "ID" column of
# `nvidia-smi mig -lgip` above (the same on the H100 and the H200).
NVML_GI_PROFILE_IDS = {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0}

_LINE = re.compile(r"Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)")


def parse_lgipp(text: str) -> dict[int, tuple[tuple[int, ...], int]]:
    """Profile id -> (starts, size) from `nvidia-smi mig -lgipp` output."""
    out = {}
    for m in _LINE.finditer(text):
        out[int(m.group(1))] = (tuple(int(s) for s in m.group(2).split(",")), int(m.group(3)))
    return out


class NvmlError(Exception):
    """What NVML answers for a placement that does not fit (NVML_ERROR_INSUFFICIENT_RESOURCES)."""


@dataclass
class GpuInstance:
    id: int
    profile: str
    start: int
    size: int
    compute: int
    uuid: str


@dataclass
class FakeMigGpu:
    """One GPU in MIG mode. `profiles` name -> (starts, size, compute slices)."""

    profiles: dict[str, tuple[tuple[int, ...], int, int]]
    memory_slices: int = 8
    compute_slices: int = 7
    instances: dict[int, GpuInstance] = field(default_factory=dict)
    _next_id: int = 1
    _made: int = 0

    @classmethod
    def h100_80gb(cls) -> FakeMigGpu:
        placements = parse_lgipp(H100_80GB_LGIPP)
        return cls(
            {
                name: (*placements[pid], compute)
                for pid, (name, compute) in H100_80GB_PROFILES.items()
            }
        )

    @classmethod
    def h200_141gb(cls) -> FakeMigGpu:
        placements = parse_lgipp(H200_141GB_LGIPP)
        return cls(
            {
                name: (*placements[pid], compute)
                for pid, (name, compute) in H200_141GB_PROFILES.items()
            }
        )

    def accepts(self, profile: str, start: int) -> bool:
        if profile not in self.profiles:
            return False
        starts, size, compute = self.profiles[profile]
        if start not in starts:
            return False
        taken = {s for gi in self.instances.values() for s in range(gi.start, gi.start + gi.size)}
        used = sum(gi.compute for gi in self.instances.values())
        return not taken & set(range(start, start + size)) and used + compute <= self.compute_slices

    def create(self, profile: str, start: int) -> GpuInstance:
        """nvmlDeviceCreateGpuInstanceWithPlacement (plus its one compute instance)."""
        if not self.accepts(profile, start):
            raise NvmlError(f"insufficient resources for {profile} at {start}")
        _, size, compute = self.profiles[profile]
        # A new UUID each creation, as NVML gives (an id is reused, a UUID is not).
        self._made += 1
        gi = GpuInstance(self._next_id, profile, start, size, compute, f"MIG-fake-{self._made:04d}")
        self.instances[gi.id] = gi
        self._next_id += 1
        return gi

    def destroy(self, gi_id: int) -> None:
        """nvmlGpuInstanceDestroy (after its compute instances)."""
        if gi_id not in self.instances:
            raise NvmlError(f"no GPU instance {gi_id}")
        del self.instances[gi_id]


class Crash(BaseException):  # a process death, not an error anyone handles
    """The agent dying right after NVML created an instance (no handler runs)."""


@dataclass
class FakeNvml:
    """The dynamic MIG NVML calls (kubeletplugin/dynamicmig.py `MigNvml`) over fake GPUs by
    PCI bus id. `crash_after_create`: the next create succeeds in NVML, then the caller dies."""

    gpus: dict[str, FakeMigGpu]
    crash_after_create: bool = False

    def create(self, bus: str, profile: str, start: int) -> Any:
        from fabricdra.kubeletplugin.kinds.nvidia.dynamicmig import Instance

        gi = self.gpus[bus].create(profile, start)
        if self.crash_after_create:
            self.crash_after_create = False
            raise Crash
        return Instance(gi.id, 0, gi.uuid, gi.profile, gi.start)

    def destroy(self, bus: str, gpu_instance: int) -> None:
        self.gpus[bus].destroy(gpu_instance)

    def instances(self, bus: str) -> list[Any]:
        from fabricdra.kubeletplugin.kinds.nvidia.dynamicmig import Instance

        return [
            Instance(gi.id, 0, gi.uuid, gi.profile, gi.start)
            for gi in self.gpus[bus].instances.values()
        ]
