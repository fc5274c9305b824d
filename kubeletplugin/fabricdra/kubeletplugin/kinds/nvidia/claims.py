"""The NVIDIA family's part in preparing a claim (kinds/family.py `ClaimHooks`): the toolkit's
CDI specs and dynamic MIG lent to its kinds, the dynamic-MIG transaction (instances a failed
prepare created are destroyed again; a claim's are destroyed at unprepare) and the `GpuConfig`
sharing strategies (gpusharing.py) as the family's opaque configuration."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace

import structlog

from ...devices import Device
from ...kubelet import PrepareError
from ..base import PrepareContext
from ..family import Undo
from ..nvidia_mig import is_placement
from . import gpusharing
from .dynamicmig import DynamicMig, JournalUnreadable
from .nvidiacdi import ToolkitSpecs

log = structlog.get_logger("fabricdra.prepare")


class GpuConfigs:
    """`GpuConfig` (gpusharing.py): a sharing strategy for whole NVIDIA GPUs."""

    def parse(self, params: object) -> gpusharing.Sharing | None:
        return gpusharing.parse_gpu_config(params)

    def check(self, device: Device, name: str, request: str) -> None:
        if device.type != "gpu":  # a whole GPU: a MIG instance or placement is `mig`
            raise PrepareError(
                f"device {name} (request {request}): a GpuConfig sharing strategy applies "
                "to whole NVIDIA GPUs only"
            )


def _nothing() -> None:
    pass


class NvidiaClaims:
    name = "nvidia"
    opaque = GpuConfigs()

    def __init__(
        self, toolkit: ToolkitSpecs | None = None, dynamic_mig: DynamicMig | None = None
    ) -> None:
        self.toolkit = toolkit if toolkit is not None else ToolkitSpecs()
        # Dynamic MIG (--dynamic-mig): creates a placement's instance at prepare and destroys
        # it at unprepare (dynamicmig.py has the order); None: such a placement is refused.
        self.dynamic_mig = dynamic_mig

    def lend(self, ctx: PrepareContext) -> PrepareContext:
        return replace(ctx, toolkit=self.toolkit, dynamic_mig=self.dynamic_mig)

    def serving(self) -> AbstractContextManager[object]:
        return self.toolkit.pinned()

    def begin(self, claim_uid: str, devices: Sequence[Device]) -> Undo:
        # Only a claim with placements reads the journal (an unreadable one fails them).
        if not any(is_placement(d) for d in devices):
            return _nothing
        made_before = self._mig_made(claim_uid)

        def undo() -> None:
            # Nothing half-made: MIG instances this call created (a claim's second
            # placement refused, device nodes missing) go again; kubelet retries.
            self._undo_mig(claim_uid, made_before)

        return undo

    def release(self, claim_uid: str, devices: Sequence[str] | None) -> None:
        if self.dynamic_mig is None:
            return
        # Only instances the journal says this claim had created; adopted ones never.
        try:
            self.dynamic_mig.destroy(claim_uid)
        except JournalUnreadable:
            # A claim recorded with no MIG device had no instance to destroy: its
            # unprepare does not wait for the journal to be mended.
            if devices is None or any(n.startswith("mig-") for n in devices):
                raise
            log.error("MIG journal unreadable; unprepared a claim without MIG devices")

    def _mig_made(self, claim_uid: str) -> set[str]:
        """The devices the journal names for this claim."""
        if self.dynamic_mig is None:
            return set()
        return {r.device for r in self.dynamic_mig.records() if r.claim == claim_uid}

    def _undo_mig(self, claim_uid: str, before: set[str]) -> None:
        if self.dynamic_mig is None:
            return
        made = self._mig_made(claim_uid) - before
        if not made:
            return
        try:
            self.dynamic_mig.destroy(claim_uid, made)
        except Exception as e:  # left in the journal: unprepare or the next prepare retries
            log.error("MIG instances of a failed prepare not destroyed", error=str(e))
