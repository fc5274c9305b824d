"""The GPU kinds' payload (types `gpu` and `mig`, NVIDIA and AMD; issue 31 point 3): its own
module, beside kinds/accelerator.py that builds it, because gpusharing.py (which
accelerator.py imports) reads it too, and an import between the two would be a cycle
(tests/unit/test_import_graph.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabricdra.api.inventory import Accelerator, MigDevice

from ..devices import Device, GpuInfo
from .base import payload_as

if TYPE_CHECKING:  # annotations only
    from .nvidia.migprofiles import Placement


@dataclass(frozen=True)
class GpuPayload:
    """A GPU's or MIG instance's own record (types `gpu` and `mig`, NVIDIA and AMD): one
    record for both, since a MIG instance, a dynamic-MIG placement and the whole GPU are built
    from the same GPU and differ only in `mig` and `placement`."""

    accelerator: Accelerator  # gpu: itself; mig: the parent GPU
    mig: MigDevice | None = None  # an existing MIG instance (static, adopted or created)
    info: GpuInfo | None = None  # NVML's facts about the (parent) GPU
    # The GPU left the PCI bus; kept published (tainted) from its last record so the claims
    # holding it keep their health signal, but prepare refuses it.
    lost: bool = False
    # Dynamic MIG only: the device draws on its GPU's counter set (`counter_set_name`): a
    # profile placement consumes its slices (`placement`), the whole GPU (no placement) all.
    # `mig` is set where the instance exists (adopted at start, or created by prepare).
    dynamic_mig: bool = False
    placement: Placement | None = None
    # gpu: offered to up to this many claims at once (gpusharing.py); 0: to one claim.
    shares: int = 0


def payload_of(device: Device) -> GpuPayload:
    """A GPU's or MIG instance's payload; TypeError for a device of another kind."""
    return payload_as(device, GpuPayload, "a GPU or MIG device")


def gpu_payload(device: Device) -> GpuPayload | None:
    """The payload where `device` is a GPU or MIG instance; None for another kind's."""
    return device.payload if isinstance(device.payload, GpuPayload) else None
