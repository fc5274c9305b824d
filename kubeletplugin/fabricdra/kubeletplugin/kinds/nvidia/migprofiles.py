"""MIG profiles and their placements, for dynamic MIG (`--dynamic-mig`, docs/attributes.md).

A Hopper GPU (H100 80 GB, H200 141 GB) in MIG mode is cut into 8 memory slices and 7 compute
slices. A GPU instance of a profile takes `size` consecutive memory slices starting at one of
the profile's allowed `start`s, and `compute` compute slices (not placed: any free ones). The
table is NVIDIA's MIG user guide, "Supported MIG Profiles", H100/H200 tables and placements
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html), the same
answer `nvidia-smi mig -lgipp` gives on the GPU. The `+me` (media extension) profiles are left
out: they share one media unit, which memory and compute slices alone cannot count.

Only the profiles we publish are here; a GPU whose model is not in `MODELS` keeps static MIG.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class Profile:
    name: str  # "3g.40gb"
    compute: int  # compute slices
    size: int  # memory slices, consecutive
    starts: tuple[int, ...]  # the memory slices a placement may start at


@dataclass(frozen=True)
class Placement:
    profile: Profile
    start: int

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.size)

    def overlaps(self, other: Placement) -> bool:
        return bool(set(self.memory_slices) & set(other.memory_slices))


@dataclass(frozen=True)
class Model:
    key: str  # "h100-80gb"
    profiles: tuple[Profile, ...]

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def placements(self) -> list[Placement]:
        return [Placement(p, s) for p in self.profiles for s in p.starts]


def _hopper(mem: tuple[str, str, str, str, str, str]) -> tuple[Profile, ...]:
    # The H100 and H200 share one layout; only the memory in the names differs.
    one, one_double, two, three, four, seven = mem
    return (
        Profile(f"1g.{one}", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        Profile(f"1g.{one_double}", 1, 2, (0, 2, 4, 6)),
        Profile(f"2g.{two}", 2, 2, (0, 2, 4)),
        Profile(f"3g.{three}", 3, 4, (0, 4)),
        Profile(f"4g.{four}", 4, 4, (0,)),
        Profile(f"7g.{seven}", 7, 8, (0,)),
    )


H100_80GB = Model("h100-80gb", _hopper(("10gb", "20gb", "20gb", "40gb", "40gb", "80gb")))
H200_141GB = Model("h200-141gb", _hopper(("18gb", "35gb", "35gb", "71gb", "71gb", "141gb")))
MODELS = (H100_80GB, H200_141GB)


def model_for(product_name: str | None, memory_mib: int | None) -> Model | None:
    """The table for a GPU, by NVML's product name and memory; None: not one we know (an H100
    NVL 94 GB, an A100, ...), which keeps static MIG."""
    if not product_name or memory_mib is None:
        return None
    name = product_name.upper()
    if "H100" in name and 76_000 <= memory_mib <= 82_000:
        return H100_80GB
    if "H200" in name and 140_000 <= memory_mib <= 146_000:
        return H200_141GB
    return None


def counters(placement: Placement) -> dict[str, int]:
    """What a placement consumes from its GPU's counter set: each memory slice it covers
    (`memory-slice-<i>`, 1 each) and its compute slices (`compute-slices`)."""
    out = {memory_slice(i): 1 for i in placement.memory_slices}
    out["compute-slices"] = placement.profile.compute
    return out


def whole_gpu_counters() -> dict[str, int]:
    """The whole GPU consumes every slice: it fits only while no instance is allocated."""
    out = {memory_slice(i): 1 for i in range(MEMORY_SLICES)}
    out["compute-slices"] = COMPUTE_SLICES
    return out


def counter_set() -> dict[str, int]:
    """A GPU's counter set: what all its devices draw on."""
    return whole_gpu_counters()


def memory_slice(i: int) -> str:
    return f"memory-slice-{i}"


def fits(placements: Iterable[Placement]) -> bool:
    """Whether these placements can exist on one GPU at once (what the counters let the
    scheduler allocate): no memory slice twice, at most 7 compute slices."""
    used: set[int] = set()
    compute = 0
    for p in placements:
        if p.start not in p.profile.starts or p.start + p.profile.size > MEMORY_SLICES:
            return False
        if used & set(p.memory_slices):
            return False
        used |= set(p.memory_slices)
        compute += p.profile.compute
    return compute <= COMPUTE_SLICES
