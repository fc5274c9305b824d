"""A device family's state and the hooks the agent calls on it (issue 31).

A family (kinds/nvidia/, ...) is built once by the wiring module (families.py) from the agent's
configuration and holds what its kinds need across passes: NVIDIA's Xid watch, the GPUs seen,
dynamic MIG and its journal, the toolkit's CDI specs. The agent holds the families and calls
these hooks without naming any of them, so a new family never edits the agent:

- `start`: at start-up, before kubelet can prepare anything (NVIDIA: resolve dynamic MIG
  records a crash left half-made);
- `observe`: once per pass, after discovery: what the family adds to the pass's facts (NVIDIA:
  the Xids seen applied to the NVML readings, the GPUs that left the bus, the MIG instances
  dynamic MIG created);
- `poll`: between passes, whether an event asks for a pass now (NVIDIA: a new critical Xid);
- `close`: when the agent stops.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fabricdra.api.inventory import Accelerator

    from ..discovery.node import Discovery
    from ..discovery.nvml import NvmlReadings


@dataclass
class PassFacts:
    """What the families add to one discovery pass; each family's `observe` fills its part."""

    nvml: NvmlReadings | None = None  # the readings health and GpuInfo use (Xids applied)
    lost: list[Accelerator] = field(default_factory=list)  # devices kept after leaving the bus
    created_mig: set[str] = field(default_factory=set)  # MIG devices dynamic MIG created


class Family(Protocol):
    @property
    def name(self) -> str:
        """The family's name (`nvidia`): logs and tests."""
        ...

    def start(self) -> None:
        """At start-up, before kubelet's sockets open."""
        ...

    def observe(self, discovery: Discovery, held: Collection[str], facts: PassFacts) -> None:
        """One pass: fill this family's part of `facts`. `held`: the devices prepared claims
        hold (and the devices those are part of)."""
        ...

    def poll(self) -> bool:
        """Between passes: True when something seen asks for a pass now."""
        ...

    def close(self) -> None: ...
