"""The wiring of device families (issue 31): the one module that builds each family's state
from the agent's configuration. The agent holds what this returns and calls the families'
hooks (kinds/family.py) without naming any; prepare gets their per-claim parts from here too.

Adding a family: its package under kinds/, one row in `build` below."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .discovery.node import NvmlSource
from .kinds.family import Family
from .kinds.nvidia.family import NvidiaFamily
from .kinds.nvidia.nvidiacdi import DEFAULT_SPEC_DIRS

if TYPE_CHECKING:
    from .devices import DeviceConfig


# Where the NVIDIA container toolkit writes its CDI specs, unless configured.
DEFAULT_TOOLKIT_DIRS: tuple[Path, ...] = DEFAULT_SPEC_DIRS


@dataclass(frozen=True)
class Families:
    nvidia: NvidiaFamily

    @property
    def all(self) -> tuple[Family, ...]:
        """Every family, in the order their hooks run."""
        return (self.nvidia,)

    @property
    def nvml_source(self) -> NvmlSource:
        """Where discovery reads NVML (the library, or recorded answers)."""
        return self.nvidia.nvml_source

    def driver_options(self) -> dict[str, Any]:
        """What prepare (prepare.DevicesDriver) takes from the families: their per-claim
        hooks (kinds/family.py ClaimHooks), in the order they run."""
        return {"families": (self.nvidia.claims,)}


def build(
    devices: DeviceConfig,
    *,
    state_dir: Path,
    boot_id: str | None,
    toolkit_cdi_dirs: tuple[Path, ...],
    nvml_snapshot: Path | None = None,
    mig_nvml: Any = None,
) -> Families:
    """The families of this node, from the agent's configuration (`mig_nvml`: the NVML calls
    dynamic MIG makes, tests' fakes; None: the library's)."""
    return Families(
        nvidia=NvidiaFamily(
            state_dir=state_dir,
            boot_id=boot_id,
            toolkit_cdi_dirs=toolkit_cdi_dirs,
            nvml_snapshot=nvml_snapshot,
            dynamic_mig=devices.dynamic_mig,
            mig_nvml=mig_nvml,
        )
    )
