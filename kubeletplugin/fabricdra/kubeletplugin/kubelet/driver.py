"""What a DRA driver gives the plugin server: the `DraDriver` protocol and its value types.

A driver is anything with a `driver_name` and two methods, called by `PluginServer` for each
claim kubelet names (one claim at a time, serialized: the server holds one lock around them):

- `prepare(claim) -> Sequence[PreparedDevice]`: make the claim's devices usable (write its
  CDI spec) and say which CDI ids each device gets. Must be idempotent — kubelet calls it again
  after its own restart and for claims a failed batch left out — and return the same devices
  and ids each time. Raise (any exception; `PrepareError` for expected refusals) to fail this
  claim: the message is sent to kubelet as the claim's error, other claims are unaffected.
- `unprepare(claim) -> None`: undo exactly what `prepare` did for this claim. The claim may
  be gone from the API and may never have been prepared (or prepared by an earlier process):
  that is success, not an error.

`ClaimRef` is all kubelet sends: namespace, name and UID of a ResourceClaim. Anything else
(the allocation) the driver reads from the API server itself.

`current_call()` is the gRPC call the driver is working for (set by the server around each
driver call): its deadline (kubelet's own, at most `KUBELET_DEADLINE` seconds) and whether
kubelet is still waiting, so a driver can bound its API reads below the deadline and stop
working for a caller that has gone. A driver that sets `locks_itself = True` is called
without the server's lock: it serializes what must be serialized itself (the devices driver
reads claims from the API outside its lock, so one slow read never delays another claim).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Health = Literal["Healthy", "Unhealthy", "Unknown"]

# kubelet gives each NodePrepareResources/NodeUnprepareResources call 45 s
# (pkg/kubelet/cm/dra/manager.go, defaultTimeout in the plugin client).
KUBELET_DEADLINE = 45.0


@dataclass(frozen=True, slots=True)
class Call:
    """The kubelet call a driver is serving: answer before `deadline` (time.monotonic());
    `active()` turns False once kubelet cancelled it or gave up."""

    deadline: float
    active: Callable[[], bool]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


_CALL: ContextVar[Call | None] = ContextVar("fabricdra_kubelet_call", default=None)


def current_call() -> Call:
    """The call being served; outside one (a direct driver call), kubelet's full deadline from
    now and always active."""
    call = _CALL.get()
    if call is None:
        return Call(time.monotonic() + KUBELET_DEADLINE, lambda: True)
    return call


@contextmanager
def serving(call: Call) -> Iterator[Call]:
    """Make `call` the `current_call()` of this thread for the block."""
    token = _CALL.set(call)
    try:
        yield call
    finally:
        _CALL.reset(token)


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as kubelet names it (the UID tells a claim from a recreated namesake)."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as kubelet records it.

    `pool_name`/`device_name` must be exactly what the ResourceSlice published (kubelet maps
    health reports through them); `request_names` are *base* request names (no
    `/subrequest`), empty meaning "every request of the claim"; `cdi_device_ids` are fully
    qualified (`vendor/class=name`) and must resolve in the CDI spec folders before kubelet
    creates the container. `share_id` is sent on DRA v1 only (v1beta1 has no such field).
    """

    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    request_names: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device's health for kubelet's health stream (`v1` / `v1alpha1.DRAResourceHealth`)."""

    pool_name: str
    device_name: str
    health: Health
    message: str | None = None


class PrepareError(Exception):
    """A claim cannot be prepared for a reason the driver understands (bad claim, unknown
    device, missing device node...). Its message is what kubelet shows in the pod's events."""


@runtime_checkable
class DraDriver(Protocol):
    """The driver side of the kubelet DRA plugin protocol (see the module docstring)."""

    @property
    def driver_name(self) -> str: ...

    def prepare(self, claim: ClaimRef) -> Sequence[PreparedDevice]: ...

    def unprepare(self, claim: ClaimRef) -> None: ...
