"""Which compute-domain nodes a gang may count on, per NVLink fabric domain (pure: Node
objects in, names out). Gang placement (placement.py) reads it; `fabricdra fleet`
(fleet.py) can share it, so "room in a fabric domain" means one thing everywhere.

A node counts when it can take a pod of the gang now:

* its `Ready` condition is `True` (a node that is NotReady or Unknown will not run the pod);
* it is schedulable: not cordoned (`spec.unschedulable`), and none of the node-lifecycle
  taints (`node.kubernetes.io/{not-ready,unreachable,unschedulable}`) that keep new pods
  off (other taints are the workload's to tolerate, so they do not count against a node);
* where the verification gate is required (`--require-verified-nodes`), it carries
  `fabricdra.io/verified=true` (docs/verification.md);
* where the multi-node NVLink check is required (`--fabric-check`), a node in a fabric domain
  (any but `none`) carries `fabricdra.io/fabric-verified=true`: a gang crosses the trays'
  NVLink trunk, which the per-node probes never see (fabriccheck.py);
* it has a GPU the scheduler can still hand out: of the GPUs (and MIG devices) its
  `devices.fabricdra.io` pool publishes (newest generation), at least one is healthy, verified
  and not allocated (`gpu_room`; a node whose GPUs are all unhealthy, gated or taken is no
  room). A node that publishes no GPU there is judged by the node alone (GPUs from another
  driver, or the devices plugin not running yet). The nodes a gang holds already count for it;
* it is not excluded for the gang (the nodes of a fabric domain that failed a gang before:
  placement.py).

The device rules (healthy, verified, allocated, free, a pool's newest generation) are the fleet
view's too (fleet.py counts with `devices()` and `allocate()` below).

Whether it is free (no other domain holds it, no other gang's placement still expects it) is
the placement's part (`placement.free_nodes`): that is ownership, not the node's state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from fabricdra.api import labels
from fabricdra.api.computedomain import gang_size
from fabricdra.api.fabriccheck import record_of
from fabricdra.api.jsontypes import JSON

from .claims import node_fabric

DRIVER = "devices.fabricdra.io"
UNHEALTHY_TAINT = "fabricdra.io/unhealthy"
UNVERIFIED_TAINT = "fabricdra.io/unverified"
_HOLDER = re.compile(r"^(?P<base>.+)-s\d+$")

# Ready's reason once a gang has run and its pods are gone (domains.py decides, status.py
# writes it): its placement then no longer counts against its fabric domain.
FINISHED = "Finished"


def finished(obj: Mapping[str, Any]) -> bool:
    """Whether the domain's status says its gang finished (Ready False, reason Finished)."""
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("reason") == FINISHED for c in conds)


def expected_by_fabric(compute_domains: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Fabric domain -> the nodes the gangs placed there still expect (their share there less
    the nodes they hold there), from the ComputeDomains' status: what `placement.free_nodes`
    subtracts. A gang in one domain (status.fabricDomain) expects numNodes there; a spanning
    gang (allowMultipleCliques, placed: status.placement) its share of each domain it is
    placed in. Not counted: elastic domains, unplaced spanning gangs, finished or deleted."""
    out: dict[str, int] = {}
    for cd in compute_domains:
        meta, spec, status = cd.get("metadata") or {}, cd.get("spec") or {}, cd.get("status") or {}
        want = gang_size(cd) or 1
        if want <= 1 or meta.get("deletionTimestamp") or finished(cd):
            continue
        if spec.get("allowMultipleCliques") is True:
            # placement.recorded_shares: a spanning gang's nodes per domain, once recorded.
            parts = {
                str(s["fabricDomain"]): int(s["nodes"])
                for s in (status.get("placement") or {}).get("shares") or []
            }
        else:
            fabric = status.get("fabricDomain") or ""
            parts = {fabric: want} if fabric else {}
        for fabric, share in parts.items():
            have = sum(1 for n in status.get("nodes") or [] if n.get("fabricDomain") == fabric)
            out[fabric] = out.get(fabric, 0) + max(share - have, 0)
    return out


# Taints the node lifecycle controller and `kubectl cordon` set: no new pod goes there.
BLOCKING_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
    }
)


def unusable(
    node: JSON, *, require_verified: bool = False, require_fabric_verified: bool = False
) -> str:
    """Why the node cannot take a gang's pod now ("" when it can)."""
    conds = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conds if c.get("type") == "Ready"), None)
    if ready != "True":
        return f"Ready is {ready or 'not reported'}"
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    for taint in spec.get("taints") or []:
        if taint.get("key") in BLOCKING_TAINTS and taint.get("effect") != "PreferNoSchedule":
            return f"tainted {taint['key']}"
    if require_verified:
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        if node_labels.get(labels.VERIFIED) != "true":
            return f"not verified ({labels.VERIFIED} is not 'true')"
    if require_fabric_verified:
        return fabric_unchecked(node)
    return ""


def in_fabric(node: JSON) -> str:
    """The node's multi-node fabric domain ("" for none: no label, or the `none` domain)."""
    fabric = node_fabric(node)
    return "" if fabric == labels.NO_FABRIC else fabric


def fabric_unchecked(node: JSON) -> str:
    """Why the node is not offered for its fabric domain's NVLink trunk ("" when its domain's
    check passed with it, or it is in no multi-node fabric domain)."""
    fabric = in_fabric(node)
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    if not fabric or node_labels.get(labels.FABRIC_VERIFIED) == "true":
        return ""
    return fabric_check_failed(node) or (
        f"fabric domain {fabric} not checked yet ({labels.FABRIC_VERIFIED} is not 'true')"
    )


# A claim's refusal reason (and its domain's Degraded reason) where its node's fabric domain
# failed the multi-node NVLink check (nodes.py).
FABRIC_CHECK_FAILED = "FabricCheckFailed"


def fabric_check_failed(node: JSON) -> str:
    """Why the node's fabric domain check failed with it ("" unless its record says so for
    the domain it is in now and no later check labelled it)."""
    fabric = in_fabric(node)
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    if not fabric or node_labels.get(labels.FABRIC_VERIFIED) == "true":
        return ""
    record = record_of(node)
    if record is not None and not record.passed and record.fabric == fabric:
        return f"fabric domain {fabric} failed its multi-node NVLink check: {record.reason}"
    return ""


def held_back_by_fabric_check(
    counted: Mapping[str, Sequence[str]],
    unchecked_too: Mapping[str, Sequence[str]],
    node: Callable[[str], JSON | None],
    check_state: Callable[[str], str],
) -> str:
    """Why the multi-node NVLink check keeps nodes from gangs, in words ("" when it keeps none):
    for each fabric domain whose nodes count without the check (`unchecked_too`) but not with
    it (`counted`), what its check is doing (`check_state`, fabriccheck.FabricCheck.state:
    waiting, running, did not run and why, failed), else what its nodes' records say. Fabric
    domains with the same cause are named together (277 racks without a verification image
    make one line, not 277)."""
    groups: dict[str, list[str]] = {}
    for fabric in sorted(unchecked_too):
        back = sorted(set(unchecked_too[fabric]) - set(counted.get(fabric, ())))
        if not back:
            continue
        why = check_state(fabric) or _record_cause(node(back[0]) or {}, fabric)
        groups.setdefault(why, []).append(fabric)
    parts = []
    for why, fabrics in list(groups.items())[:5]:
        names = ", ".join(fabrics[:3]) + (
            f" and {len(fabrics) - 3} more" if len(fabrics) > 3 else ""
        )
        parts.append(f"fabric domain{'s' if len(fabrics) > 1 else ''} {names}: {why}")
    if len(groups) > 5:
        parts.append(f"{len(groups) - 5} more causes")
    if not parts:
        return ""
    return (
        "the multi-node NVLink check (--fabric-check) has not passed with nodes that would "
        "count: " + "; ".join(parts)
    )


def _record_cause(node: JSON, fabric: str) -> str:
    record = record_of(node)
    if record is not None and not record.passed and record.fabric == fabric:
        return f"the check failed: {record.reason}"
    return f"not checked yet ({labels.FABRIC_VERIFIED} is not 'true')"


def usable_by_fabric(
    nodes: Iterable[JSON],
    *,
    require_verified: bool = False,
    require_fabric_verified: bool = False,
    exclude: Set[str] = frozenset(),
    gpu_room: Mapping[str, int] | None = None,
    keep: Set[str] = frozenset(),
) -> dict[str, list[str]]:
    """Fabric domain -> the names of its nodes that count (see the module docstring). A
    fabric domain whose nodes all fail is listed with none, so it is still known.
    `gpu_room` (node -> free GPUs, `gpu_room()`): a node whose published GPUs are none of them
    free does not count; one with no GPUs published is judged by the node alone. `keep`: the
    nodes the gang itself holds already (their GPUs are allocated to it: still its room)."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        fabric = node_fabric(node)
        if not fabric:
            continue
        names = out.setdefault(fabric, [])
        name = node["metadata"]["name"]
        why = unusable(
            node, require_verified=require_verified, require_fabric_verified=require_fabric_verified
        )
        if name in exclude or why:
            continue
        if gpu_room is not None and name not in keep and gpu_room.get(name, 1) <= 0:
            continue
        names.append(name)
    return out


# --- devices: what the scheduler can still hand out (shared with fleet.py) -----------------


@dataclass
class Device:
    node: str
    name: str
    type: str
    device_class: str
    fabric_domain: str | None
    healthy: bool
    verified: bool
    pci_root: str | None = None
    shared_capacity: int | None = None  # holders a shared endpoint takes (current model)
    holders: int = 1  # published holder devices (basic model)
    allocations: int = 0
    holders_taken: set[str] = field(default_factory=set)

    @property
    def allocated(self) -> bool:
        return self.allocations > 0

    @property
    def free(self) -> bool:
        return self.healthy and self.verified and not self.allocated

    @property
    def usable_nic(self) -> bool:
        """A NIC a claim can still get (a shared one: a holder is left)."""
        return not self.exhausted and self.healthy and self.verified

    @property
    def exhausted(self) -> bool:
        """No further claim can get this device (a shared one: every holder is taken)."""
        if self.shared_capacity is not None:
            return self.allocations >= self.shared_capacity
        if self.holders > 1:
            return len(self.holders_taken) >= self.holders
        return self.allocated


def attr(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _generation(spec: Mapping[str, Any]) -> int:
    return int((spec.get("pool") or {}).get("generation") or 0)


def devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Device]:
    ours = [s.get("spec") or {} for s in slices]
    ours = [spec for spec in ours if spec.get("driver") == DRIVER]
    # Only a pool's newest generation counts: the publisher writes a new generation's slices
    # before it deletes the old ones, and the scheduler ignores the older (KEP-4381).
    newest: dict[str, int] = {}
    for spec in ours:
        pool = (spec.get("pool") or {}).get("name") or ""
        newest[pool] = max(newest.get(pool, 0), _generation(spec))
    out: dict[tuple[str, str], Device] = {}
    for spec in ours:
        if _generation(spec) < newest[(spec.get("pool") or {}).get("name") or ""]:
            continue
        node = spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "?"
        for d in spec.get("devices") or []:
            name = d["name"]
            shared = attr(d, "rdmaMode") == "shared"
            m = _HOLDER.match(name) if shared and not d.get("allowMultipleAllocations") else None
            base = m.group("base") if m else name
            taints = {t.get("key") for t in d.get("taints") or []}
            key = (node, base)
            if key in out:  # another holder of a shared endpoint (basic model)
                out[key].holders += 1
                continue
            type_ = attr(d, "type") or "unknown"
            capacity = ((d.get("capacity") or {}).get("holders") or {}).get("value")
            out[key] = Device(
                node=node,
                name=base,
                type=type_,
                device_class=attr(d, "deviceClass") or type_,
                fabric_domain=attr(d, "fabricDomain"),
                healthy=UNHEALTHY_TAINT not in taints
                and attr(d, "linkVerdict") != "Failed"
                and attr(d, "health") != "Unhealthy",
                verified=UNVERIFIED_TAINT not in taints and attr(d, "verified") is not False,
                pci_root=attr(d, "pciRoot"),
                shared_capacity=int(capacity)
                if capacity and d.get("allowMultipleAllocations")
                else None,
            )
    return out


def allocate(devices: dict[tuple[str, str], Device], claims: Iterable[Mapping[str, Any]]) -> None:
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            # An admin-access result (monitoring, debugging) shares the device with whoever
            # holds it and is not counted by the scheduler's allocator: it takes nothing.
            if r.get("driver") != DRIVER or r.get("adminAccess") is True:
                continue
            name, pool = r.get("device", ""), r.get("pool", "")
            device = devices.get((pool, name))
            if device is None:
                m = _HOLDER.match(name)
                device = devices.get((pool, m.group("base"))) if m else None
                if device is None:
                    continue  # a device no longer published: nothing to count it against
                device.holders_taken.add(name)
            device.allocations += 1


# What `devices()` reads of a published device: the rest (product name, UUID, PCI bus id,
# NUMA node, netdev, ...) is not kept in the controller's cache of every GPU slice.
DEVICE_ATTRIBUTES = frozenset(
    {"type", "deviceClass", "fabricDomain", "linkVerdict", "health", "verified", "pciRoot",
     "rdmaMode"}
)  # fmt: skip


def device_slice_view(obj: Mapping[str, Any]) -> JSON:
    """A `devices.fabricdra.io` ResourceSlice cut down to what `devices()` reads (an
    informer transform): a parsed slice of the sample 8-GPU node is about 84 KB in memory and
    this view about 9 KB, so 5,000 nodes' slices fit the controller's 512 Mi limit."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    devices_ = []
    for d in spec.get("devices") or []:
        view: JSON = {
            "name": d.get("name", ""),
            "attributes": {
                k: v for k, v in (d.get("attributes") or {}).items() if k in DEVICE_ATTRIBUTES
            },
        }
        if d.get("taints"):
            view["taints"] = [{"key": t.get("key"), "effect": t.get("effect")} for t in d["taints"]]
        if "allowMultipleAllocations" in d:
            view["allowMultipleAllocations"] = d["allowMultipleAllocations"]
        holders = (d.get("capacity") or {}).get("holders")
        if holders is not None:
            view["capacity"] = {"holders": holders}
        devices_.append(view)
    kept = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
    return {
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": spec.get("pool"),
            "devices": devices_,
        },
    }


# Node status fields nothing here reads (a real node lists every image it holds, its
# volumes, its kubelet's versions): not kept in the controller's Node caches.
UNREAD_NODE_STATUS = frozenset(
    {"images", "volumesInUse", "volumesAttached", "nodeInfo", "daemonEndpoints", "config",
     "runtimeHandlers", "features", "capacity", "allocatable"}
)  # fmt: skip


def node_view(obj: Mapping[str, Any]) -> JSON:
    """A Node without managedFields and the status fields nobody here reads (an informer
    transform): its labels, spec (cordon, taints), conditions and addresses stay."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    status = {k: v for k, v in (obj.get("status") or {}).items() if k not in UNREAD_NODE_STATUS}
    return {**obj, "metadata": meta, "status": status}


GPU_TYPES = frozenset({"gpu", "mig"})
# The published types a GPU's own fabric traffic goes through: RDMA endpoints, and AWS EFA
# functions where the node offers them (docs/attributes.md, "AWS EFA").
NIC_TYPES = frozenset({"rdma", "efa"})


def gpu_room(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
) -> dict[str, int]:
    """Node -> how many of its published GPUs (and MIG devices) are free: healthy, verified,
    not allocated. Nodes that publish none are absent."""
    by_key = devices(slices)
    allocate(by_key, claims)
    out: dict[str, int] = {}
    for d in by_key.values():
        if d.type in GPU_TYPES:
            out[d.node] = out.get(d.node, 0) + d.free
    return out
