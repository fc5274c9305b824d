"""The accelerator backend interface: one backend per PCI vendor whose GPUs have a source of
their own beyond the PCI walk (NVML for NVIDIA; the amdgpu driver's files and KFD for AMD).

A backend is asked once a pass, and only when the node has that vendor's accelerators: `read`
gets the PCI functions found for its vendor and returns its readings (whatever it needs to keep:
the pass's `Discovery` carries them to health and publishing). `facts` then says, per GPU, what
the generic record takes from the vendor, in one vendor-neutral shape (`GpuFacts`), and
`fabric_known` whether the fabric question could be asked about it. accelerators.py applies the
facts; it never branches on vendor.

A fact the vendor did not answer is None, never a default: absent from the record (seed 000:
an inability to ask is not an answer of no).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from fabricdra.api.inventory import Fabric, FabricRegistration

from ..sysfs import SysfsTree

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Function:
    """One PCI function of the backend's vendor that is an accelerator (from the PCI scan)."""

    bus_id: str  # sysfs form, `0000:1b:00.0`
    device_id: str | None


@dataclass(frozen=True, slots=True)
class MigFacts:
    """One MIG instance (NVIDIA); the class and profile are derived from `name`."""

    uuid: str
    name: str | None = None
    memory_mib: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What a vendor's source says about one GPU. None: not answered (left off the record)."""

    product: str | None = None
    # Whether the product string alone decides the device class (NVML's names are what the
    # class table is written in). False: a board string (an AMD FRU name, programmed by the
    # board maker) decides only when the table knows it; otherwise the PCI id does.
    product_decides_class: bool = True
    uuid: str | None = None
    memory_mib: int | None = None
    mig_mode: bool | None = None  # None: the vendor has no MIG (the MIG fields stay unset)
    mig_devices: tuple[MigFacts, ...] = ()
    registration: FabricRegistration | None = None
    fabric: Fabric | None = None  # only once established (labels.py aggregates it per node)


class AcceleratorBackend(Protocol[R]):
    """One vendor's source of GPU facts (module docstring)."""

    @property
    def vendor_id(self) -> str:
        """The PCI vendor id it answers for, `0x10de` form."""
        ...

    def read(self, tree: SysfsTree, functions: Sequence[Function]) -> R:
        """This pass's readings for these functions. Never raises for a reading that failed:
        that is a reading too (recorded, so health and labels can say Unknown)."""
        ...

    def facts(self, readings: R, bus_id: str) -> GpuFacts | None:
        """The facts for one GPU; None when the source knows nothing of it (the record then
        has only what the PCI walk and the class table give)."""
        ...

    def fabric_known(self, readings: R, bus_id: str) -> tuple[bool, bool]:
        """(whether this GPU's scale-up fabric could be asked about, whether its member count
        could): a fabric nobody could ask about is unknown, not absent."""
        ...


@dataclass(frozen=True, slots=True)
class VendorPass(Generic[R]):
    """A backend and what it read this pass, bound together so the readings keep their type."""

    backend: AcceleratorBackend[R]
    readings: R

    def facts(self, bus_id: str) -> GpuFacts | None:
        return self.backend.facts(self.readings, bus_id)

    def fabric_known(self, bus_id: str) -> tuple[bool, bool]:
        return self.backend.fabric_known(self.readings, bus_id)


def run(
    backend: AcceleratorBackend[R], tree: SysfsTree, functions: Sequence[Function]
) -> VendorPass[R]:
    return VendorPass(backend, backend.read(tree, functions))
