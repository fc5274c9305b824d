"""The fleet view: per fabric domain and device class, what exists, works, is taken and is free,
and which GPUs are stranded. Pure: API objects (plain dicts, wire form) in, a `Fleet` out; the
`fabricdra fleet` command and the controller's fleet metrics both read it (docs/fleet.md).

Counting rules (the device seed's free/allocated accounting):

* a device is one published `devices.fabricdra.io` device; a shared RDMA endpoint published as
  holder devices `<name>-s<k>` (1.34/1.35) counts once;
* healthy: no `fabricdra.io/unhealthy` taint, no `linkVerdict: Failed` and no `health:
  Unhealthy` attribute (1.34/1.35 publish no taints: the attribute is all there is);
* verified: no `fabricdra.io/unverified` taint and no `verified: false` attribute;
* allocated: named by an allocation result of a ResourceClaim (driver devices.fabricdra.io)
  that is not `adminAccess` (admin access looks at a device without taking it: the scheduler
  still hands it out);
* free: healthy, verified and not allocated — what placement may still hand out.

Stranded GPUs (free, yet no job that needs them whole can get them), each counted once:

* `computeDomain`: free GPUs on a node a ComputeDomain holds (one domain per node: they cannot
  join another domain);
* `nicsUnavailable`: free GPUs on a node with RDMA NICs none of which is free (all taken or
  failed), so no GPU there gets its own NIC.

Fragmentation, per fabric domain: `largestFit` is the largest N for which an N-node
ComputeDomain fits now (nodes whose GPUs are all free and that no ComputeDomain holds), and
`freeGpusOnPartialNodes` the free GPUs sitting on nodes that are not whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DRIVER = "devices.fabricdra.io"
UNHEALTHY_TAINT = "fabricdra.io/unhealthy"
UNVERIFIED_TAINT = "fabricdra.io/unverified"
NO_DOMAIN = "none"  # nodes whose GPUs are in no multi-node fabric domain
STRANDED_REASONS = ("computeDomain", "nicsUnavailable")
_HOLDER = re.compile(r"^(?P<base>.+)-s\d+$")


@dataclass
class Counts:
    total: int = 0
    healthy: int = 0
    verified: int = 0
    allocated: int = 0
    free: int = 0
    stranded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STRANDED_REASONS, 0))

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "healthy": self.healthy,
            "verified": self.verified,
            "allocated": self.allocated,
            "free": self.free,
            "stranded": {**self.stranded, "total": sum(self.stranded.values())},
        }


@dataclass
class Domain:
    name: str
    nodes: int = 0
    verifiedNodes: int = 0
    largestFit: int = 0
    freeGpusOnPartialNodes: int = 0
    classes: dict[str, Counts] = field(default_factory=dict)


@dataclass
class Fleet:
    domains: dict[str, Domain]
    computeDomains: list[dict[str, Any]]

    def totals(self) -> dict[str, Counts]:
        out: dict[str, Counts] = {}
        for d in self.domains.values():
            for cls, c in d.classes.items():
                t = out.setdefault(cls, Counts())
                t.total += c.total
                t.healthy += c.healthy
                t.verified += c.verified
                t.allocated += c.allocated
                t.free += c.free
                for reason, n in c.stranded.items():
                    t.stranded[reason] += n
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "domains": [
                {
                    "fabricDomain": d.name,
                    "nodes": d.nodes,
                    "verifiedNodes": d.verifiedNodes,
                    "largestFit": d.largestFit,
                    "freeGpusOnPartialNodes": d.freeGpusOnPartialNodes,
                    "classes": {cls: c.to_json() for cls, c in sorted(d.classes.items())},
                }
                for d in sorted(self.domains.values(), key=lambda d: d.name)
            ],
            "totals": {cls: c.to_json() for cls, c in sorted(self.totals().items())},
            "computeDomains": self.computeDomains,
        }


@dataclass
class _Device:
    node: str
    name: str
    type: str
    device_class: str
    fabric_domain: str | None
    healthy: bool
    verified: bool
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
    def exhausted(self) -> bool:
        """No further claim can get this device (a shared one: every holder is taken)."""
        if self.shared_capacity is not None:
            return self.allocations >= self.shared_capacity
        if self.holders > 1:
            return len(self.holders_taken) >= self.holders
        return self.allocated


def _attr(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], _Device]:
    out: dict[tuple[str, str], _Device] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        node = spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "?"
        for d in spec.get("devices") or []:
            name = d["name"]
            shared = _attr(d, "rdmaMode") == "shared"
            m = _HOLDER.match(name) if shared and not d.get("allowMultipleAllocations") else None
            base = m.group("base") if m else name
            taints = {t.get("key") for t in d.get("taints") or []}
            key = (node, base)
            if key in out:  # another holder of a shared endpoint (basic model)
                out[key].holders += 1
                continue
            type_ = _attr(d, "type") or "unknown"
            capacity = ((d.get("capacity") or {}).get("holders") or {}).get("value")
            out[key] = _Device(
                node=node,
                name=base,
                type=type_,
                device_class=_attr(d, "deviceClass") or type_,
                fabric_domain=_attr(d, "fabricDomain"),
                healthy=UNHEALTHY_TAINT not in taints
                and _attr(d, "linkVerdict") != "Failed"
                and _attr(d, "health") != "Unhealthy",
                verified=UNVERIFIED_TAINT not in taints and _attr(d, "verified") is not False,
                shared_capacity=int(capacity)
                if capacity and d.get("allowMultipleAllocations")
                else None,
            )
    return out


def _allocate(devices: dict[tuple[str, str], _Device], claims: Iterable[Mapping[str, Any]]) -> None:
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
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


def _held_nodes(
    compute_domains: Iterable[Mapping[str, Any]],
) -> tuple[set[str], list[dict[str, Any]]]:
    held: set[str] = set()
    views = []
    for cd in compute_domains:
        meta, spec, status = cd.get("metadata") or {}, cd.get("spec") or {}, cd.get("status") or {}
        nodes = sorted(n.get("name", "") for n in status.get("nodes") or [] if n.get("name"))
        held.update(nodes)
        ready = next(
            (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
            "Unknown",
        )
        views.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "fabricDomain": status.get("fabricDomain") or "",
                "numNodes": spec.get("numNodes"),
                "ready": ready,
                "nodes": nodes,
            }
        )
    views.sort(key=lambda v: (v["namespace"], v["name"]))
    return held, views


def _verified_nodes(node_devices: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
    out = {}
    for nd in node_devices:
        state = ((nd.get("status") or {}).get("verification") or {}).get("state")
        out[(nd.get("metadata") or {}).get("name", "")] = state in ("Verified", "Overridden")
    return out


def fleet(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    node_devices: Iterable[Mapping[str, Any]],
    compute_domains: Iterable[Mapping[str, Any]],
) -> Fleet:
    devices = _devices(slices)
    _allocate(devices, claims)
    held, cd_views = _held_nodes(compute_domains)
    verified_nodes = _verified_nodes(node_devices)

    by_node: dict[str, list[_Device]] = {}
    for d in devices.values():
        by_node.setdefault(d.node, []).append(d)

    domains: dict[str, Domain] = {}
    for node, node_devs in sorted(by_node.items()):
        gpus = [d for d in node_devs if d.type == "gpu"]
        nics = [d for d in node_devs if d.type == "rdma"]
        fabric = sorted({d.fabric_domain for d in gpus if d.fabric_domain})
        # A node's NICs and MIG devices count under its GPUs' domain (one per node).
        domain = domains.setdefault(
            fabric[0] if fabric else NO_DOMAIN, Domain(fabric[0] if fabric else NO_DOMAIN)
        )
        domain.nodes += 1
        # A node without a NodeDevices verification record is judged by its slices.
        node_verified = verified_nodes.get(node, all(d.verified for d in node_devs))
        domain.verifiedNodes += node_verified
        nics_gone = bool(nics) and all(n.exhausted or not n.healthy or not n.verified for n in nics)
        whole = bool(gpus) and node not in held and all(g.free for g in gpus)
        if whole:
            domain.largestFit += 1
        for d in node_devs:
            c = domain.classes.setdefault(d.device_class, Counts())
            c.total += 1
            c.healthy += d.healthy
            c.verified += d.verified
            c.allocated += d.allocated
            c.free += d.free
            if d.type != "gpu" or not d.free:
                continue
            if node in held:
                c.stranded["computeDomain"] += 1
            elif nics_gone:
                c.stranded["nicsUnavailable"] += 1
            elif not whole:
                domain.freeGpusOnPartialNodes += 1
    return Fleet(domains, cd_views)
