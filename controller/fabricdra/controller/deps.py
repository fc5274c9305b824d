"""What the reconcilers (domains.py, nodes.py, fabriccheck.py) and gang placement (placement.py)
are given, instead of the whole Controller (issue 21): the caches they read, as a read-only
view, the API calls they make, the in-memory ownership state, the few settings they use, and
callables that put a key back on a queue. manager.py wires them; a test can hand in-memory ones."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from fabricdra.api.jsontypes import JSON
from fabricdra.kube.rest import Kind

from .liveness import Heartbeats
from .objects import DaemonSettings
from .ownership import Ownership
from .status import Event

if TYPE_CHECKING:
    from fabricdra.api.computedomain import ComputeDomain

    from .fabriccheck import Runner
    from .placement import Placement

# A queue's `add` (run the key soon) and `add_after` (run it once `delay` seconds passed).
Enqueue = Callable[[str], None]
EnqueueAfter = Callable[[str, float], None]


class Cache(Protocol):
    """The read side of an informer (kube/informer.py): reconcilers never write a cache."""

    def get(self, key: str) -> JSON | None: ...

    def items(self) -> list[JSON]: ...

    def by_index(self, name: str, value: str) -> list[JSON]: ...

    def index_values(self, name: str) -> dict[str, int]: ...


class Api(Protocol):
    """The REST calls the reconcilers make (kube/rest.py's Rest; writes.py counts them)."""

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> JSON: ...

    def list(
        self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None
    ) -> JSON: ...

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        sub: str = "",
        content_type: str = ...,
    ) -> JSON: ...

    def apply(
        self,
        kind: Kind,
        name: str,
        body: JSON,
        namespace: str | None = None,
        *,
        field_manager: str,
        sub: str = "",
    ) -> JSON: ...

    def replace(self, kind: Kind, name: str, body: JSON, namespace: str | None = None) -> JSON: ...

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool: ...


class Writes(Protocol):
    """writes.py's Writer: create-if-absent, get-or-None, and best-effort Events."""

    def create(self, kind: Kind, body: JSON, namespace: str | None = None) -> JSON | None: ...

    def get(self, kind: Kind, name: str, namespace: str | None) -> JSON | None: ...

    def event(self, domain: ComputeDomain, ev: Event) -> None: ...

    def domain_event(self, meta: JSON, ev: Event) -> None: ...


@dataclass(frozen=True)
class DomainDeps:
    """What the domain reconciler reads and writes."""

    rest: Api
    writer: Writes
    domains: Cache
    claims: Cache
    nodes: Cache
    leases: Cache
    templates: Cache
    daemonsets: Cache
    ownership: Ownership
    placement: Placement
    heartbeats: Heartbeats
    namespace: str  # the driver's namespace (the managed daemons' objects)
    daemon: DaemonSettings
    channel_count: int
    requeue_after: EnqueueAfter  # the domain queue's add_after
    # The Workload API (workloads.py), where the API server serves PodGroups: pods (in a
    # group; by claim template) and PodGroups. None: not served.
    pods: Cache | None = None
    podgroups: Cache | None = None


@dataclass(frozen=True)
class NodeDeps:
    """What the node reconciler reads and writes."""

    rest: Api
    writer: Writes
    domains: Cache
    claims: Cache
    nodes: Cache
    slices: Cache
    ownership: Ownership
    placement: Placement
    gang_timeout_seconds: float
    require_synced: Callable[[], None]
    enqueue_domain: Enqueue
    enqueue_node: Enqueue
    enqueue_node_after: EnqueueAfter
    # Under --fabric-check, elastic and multi-clique domains (never placed) are refused nodes
    # whose fabric domain's check failed; the check's own domain (in `namespace`) is not.
    fabric_check: bool = False
    namespace: str = ""


@dataclass(frozen=True)
class PlacementDeps:
    """What gang placement reads (and records: records.record_fabric)."""

    rest: Api
    domains: Cache
    nodes: Cache
    claims: Cache  # the domains' claims, by domain (BY_DOMAIN)
    device_slices: Cache  # the devices plugin's GPU slices, by node
    allocations: Cache  # every claim's allocation, by node
    ownership: Ownership
    require_verified_nodes: bool
    enqueue_domain: Enqueue
    # Nodes of a fabric domain count only once its multi-node NVLink check passed with them
    # (the controller's --fabric-check; capacity.fabric_unchecked).
    require_fabric_verified: bool = False
    # Fabric domain -> what its check is doing, for a waiting gang's message ("" when nothing
    # to say: fabriccheck.FabricCheck.state).
    fabric_check_state: Callable[[str], str] = lambda fabric: ""


@dataclass(frozen=True)
class FabricCheckDeps:
    """What the multi-node NVLink check (fabriccheck.py) reads and writes."""

    patch_node: Callable[[str, JSON], object]  # a merge patch of a Node
    node_event: Callable[[str, Event], None]  # a best-effort Event on a Node
    nodes: Cache  # the compute-domain plugin's Nodes, indexed BY_FABRIC
    node_devices: Cache  # NodeDevices (fabriccheck.node_devices_view), by node name
    device_slices: Cache  # the devices plugin's slices, indexed BY_NODE
    allocations: Cache  # every claim's allocation, by node (BY_NODE): GPU jobs there
    held: Callable[[str], bool]  # whether a ComputeDomain holds the node
    runner: Runner
    require_verified_nodes: bool
    require_synced: Callable[[], None]
    requeue_after: EnqueueAfter  # the fabric queue's add_after
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    # A fabric domain's check state (FabricCheck.state) changed: waiting gangs say it.
    state_changed: Callable[[str], None] = lambda fabric: None
    # After a check passed, run the measured loss (fabricloss.py; --fabric-check-loss).
    measure_loss: bool = False
