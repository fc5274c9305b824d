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

Prepare (prepare.py) holds each family's per-claim part (`ClaimHooks`, built with the family:
`Families.driver_options`) and calls it without naming any family:

- `lend`: what the family's kinds need to serve a claim's devices, put in their
  `PrepareContext` (NVIDIA: the toolkit's CDI specs, dynamic MIG);
- `begin` → undo: before the claim's devices are served; the undo is called when prepare fails
  after that, so nothing serving made is left behind (NVIDIA: destroy the MIG instances this
  call created);
- `serving`: the section the claim's devices are served in (NVIDIA: one look at the toolkit's
  spec folders for all of them);
- `release`: at unprepare, what the claim's prepare made (NVIDIA: its MIG instances);
- `opaque`: the opaque configuration the family takes (NVIDIA: `GpuConfig`'s sharing
  strategy); None: none. Today one family takes opaque configuration: the first that has one
  parses every entry addressed to this driver.

And each family's part in the environment a pod shares across its claims (`PodEnv`, built by
`kinds.pod_envs`; RDMA: NCCL's pod-wide HCA list, KEP-5729 PodGroups, NCCL_TOPO_FILE):
`read` before the lock, then `begin` → `extend` → `commit` under it, `remove` on failure and
at unprepare.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fabricdra.api.inventory import Accelerator

    from ..devices import Device, DeviceInventory
    from ..discovery.node import Discovery
    from ..discovery.nvml import NvmlReadings
    from ..hostdevices import HostLayout
    from ..kubelet import ClaimRef, PreparedDevice
    from ..kubelet.cdi import CdiSpec, CdiWriter, ContainerEdits
    from ..kubelet.checkpoint import ClaimEntry
    from .base import PrepareContext


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


class Undo(Protocol):
    def __call__(self) -> None:
        """Undo what serving the claim's devices made (best effort: log, never raise)."""
        ...


class OpaqueSetting(Protocol):
    """One opaque configuration entry, parsed (NVIDIA: a `GpuConfig` sharing strategy)."""

    def edits(self, devices: int) -> ContainerEdits:
        """What a container given `devices` devices under this setting also gets, in its own
        CDI device (empty: none)."""
        ...


class OpaqueConfigs(Protocol):
    """The opaque configuration a family takes (dra-example-driver's ConfigHandler)."""

    def parse(self, params: object) -> OpaqueSetting | None:
        """An entry's `parameters`, parsed (None: it sets nothing); PrepareError naming what
        is wrong."""
        ...

    def check(self, device: Device, name: str, request: str) -> None:
        """PrepareError when a setting cannot apply to `device` (allocated as `name` for
        `request`)."""
        ...


class ClaimHooks(Protocol):
    """A family's part in preparing a claim (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def opaque(self) -> OpaqueConfigs | None: ...

    def lend(self, ctx: PrepareContext) -> PrepareContext:
        """`ctx` with what this family's kinds need to serve a device."""
        ...

    def begin(self, claim_uid: str, devices: Sequence[Device]) -> Undo:
        """Before the claim's `devices` are served (under the checkpoint's lock)."""
        ...

    def serving(self) -> AbstractContextManager[object]:
        """The section the claim's devices are served in."""
        ...

    def release(self, claim_uid: str, devices: Sequence[str] | None) -> None:
        """At unprepare (under the lock): remove what the claim's prepare made. `devices`:
        the names the checkpoint recorded for it (None: no entry)."""
        ...


class PodClaim(Protocol):
    """One claim's part in its pod's environment, read before the checkpoint's lock
    (`PodEnv.read`) and used under it."""

    @property
    def consumers(self) -> tuple[str, ...]:
        """What the checkpoint records as the claim's consumers (the pods it is reserved
        for, and their groups)."""
        ...

    def begin(
        self, entries: Sequence[ClaimEntry], claim_uid: str, devices: Sequence[Device]
    ) -> list[str]:
        """Before the claim's devices are served: the names its pod-wide list selects
        (RDMA: NCCL_IB_HCA over the pod's claims)."""
        ...

    def extend(
        self,
        claim: ClaimRef,
        devices: Sequence[Device],
        entries: Sequence[ClaimEntry],
        inventory: DeviceInventory,
        host: HostLayout,
        cdi: CdiWriter,
        spec: CdiSpec | None,
        prepared: list[PreparedDevice],
    ) -> tuple[CdiSpec | None, list[PreparedDevice]]:
        """The claim's spec and devices with what the pod adds (RDMA: NCCL_TOPO_FILE)."""
        ...

    def commit(self) -> None:
        """Just before the claim is recorded: bring the pod's other claims up to it."""
        ...


class PodEnv(Protocol):
    """A family's part in the environment a claim's pod shares across its claims (RDMA:
    NCCL's pod-wide HCA list and the per-pod NCCL_TOPO_FILE)."""

    def start(self, claims: Iterable[str]) -> None:
        """At start-up: keep only what the prepared `claims` (uids) made."""
        ...

    def read(self, obj: dict[str, Any], devices: Sequence[Device]) -> PodClaim:
        """Before the lock: what the claim `obj` (its `devices` in the current inventory)
        needs from the API; PrepareError when that cannot be read."""
        ...

    def remove(self, claim_uid: str) -> None:
        """What this claim's prepare made (a failed prepare, or unprepare)."""
        ...
