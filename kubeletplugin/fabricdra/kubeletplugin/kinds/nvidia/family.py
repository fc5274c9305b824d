"""The NVIDIA family's state (issue 31): the NVML source, the Xid watch, the GPUs seen,
dynamic MIG with its journal, and the container toolkit's CDI specs; built once by families.py
and driven through the hooks of kinds/family.py."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import structlog

from ...discovery.node import Discovery, NvmlSource
from ...discovery.nvml import (
    LiveXidEvents,
    ReplayedXidEvents,
    XidEventSource,
    load_snapshot,
    read_live,
)
from ..family import PassFacts
from .claims import NvidiaClaims
from .dynamicmig import DynamicMig, MigNvml
from .mignvml import LiveMigNvml
from .nvidiacdi import ToolkitSpecs
from .seengpus import SeenGpus
from .xids import XidWatch

log = structlog.get_logger("fabricdra.agent")


class NvidiaFamily:
    name = "nvidia"

    def __init__(
        self,
        *,
        state_dir: Path,
        boot_id: str | None,
        toolkit_cdi_dirs: tuple[Path, ...],
        nvml_snapshot: Path | None = None,
        dynamic_mig: bool = False,
        mig_nvml: MigNvml | None = None,
    ) -> None:
        self.nvml_source: NvmlSource = read_live
        xid_source: XidEventSource = LiveXidEvents()
        if nvml_snapshot is not None:
            snapshot = nvml_snapshot
            self.nvml_source = lambda: load_snapshot(snapshot)
            xid_source = ReplayedXidEvents(snapshot)
        # The critical Xids seen in this boot (they are events: NVML never repeats them).
        self.xids = XidWatch(xid_source, state_file=state_dir / "xid-errors.json", boot_id=boot_id)
        # The last record of every GPU seen in this boot: a lost GPU a claim holds is kept
        # published across a restart.
        self.seen_gpus = SeenGpus(state_dir / "gpus-seen.json", boot_id)
        self.toolkit = ToolkitSpecs(toolkit_cdi_dirs)
        # Dynamic MIG creates instances through NVML itself; with recorded NVML answers
        # (--nvml-snapshot) there is no GPU to create them on, and placements are refused.
        if mig_nvml is None and dynamic_mig and nvml_snapshot is None:
            mig_nvml = LiveMigNvml()
        self.dynamic_mig: DynamicMig | None = None
        if dynamic_mig and mig_nvml is not None:
            # The MIG instances dynamic MIG created (dynamicmig.py): survives restarts.
            self.dynamic_mig = DynamicMig(mig_nvml, state_dir / "dynamic-mig.json")
        # Its part in each prepare (begin -> undo, release, GpuConfig): prepare.py's hooks.
        self.claims = NvidiaClaims(self.toolkit, self.dynamic_mig)

    def start(self) -> None:
        self.recover_mig()

    def recover_mig(self) -> list[str]:
        """Destroy the MIG instances a crash left half-recorded (dynamicmig.py); the devices
        concerned. An NVML failure is logged: the journal keeps them for the next start."""
        if self.dynamic_mig is None:
            return []
        try:
            touched = self.dynamic_mig.recover()
        except Exception as e:
            log.error("dynamic MIG recovery failed; retried at the next start", error=str(e))
            return []
        if touched:
            log.warning("dynamic MIG records resolved at start-up", devices=touched)
        return touched

    def observe(self, discovery: Discovery, held: Collection[str], facts: PassFacts) -> None:
        facts.nvml = self.xids.apply(facts.nvml)  # with the Xids seen: health and GpuInfo
        # A GPU the kernel removed (fell off the bus) stays offered, tainted, from its last
        # record until this process ends, and after a restart while a claim holds it, so the
        # claims holding it keep their health signal (seengpus.py).
        current = None if "accelerators" in discovery.failures else discovery.accelerators
        lost = self.seen_gpus.update(current, set(held))
        if lost:
            log.warning("GPUs left the PCI bus; kept, tainted", gpus=[a.pciBusId for a in lost])
        facts.lost.extend(lost)
        facts.created_mig |= self._created_mig()

    def _created_mig(self) -> set[str]:
        if self.dynamic_mig is None:
            return set()
        try:
            return self.dynamic_mig.created()
        except Exception as e:  # an unreadable journal: its instances are adopted, not lost
            log.error("dynamic MIG journal unreadable", error=str(e))
            return set()

    def poll(self) -> bool:
        return self.xids.poll()

    def close(self) -> None:
        self.xids.close()
