"""The fleet view: per fabric domain and device class, what exists, works, is taken and is free,
and which GPUs are stranded. Pure: API objects (plain dicts, wire form) in, a `Fleet` out; the
`fabricdra fleet` command and the controller's fleet metrics both read it (docs/fleet.md).

Counting rules (the device seed's free/allocated accounting):

* a device is one published `devices.fabricdra.io` device of a pool's newest generation (the
  slices of an older `spec.pool.generation` still listed are being replaced: ignored); a shared
  RDMA endpoint published as holder devices `<name>-s<k>` (1.34/1.35) counts once;
* healthy: no `fabricdra.io/unhealthy` taint, no `linkVerdict: Failed` and no
  `health: Unhealthy` attribute (1.34/1.35 publish health as that attribute, not a taint);
* verified: no `fabricdra.io/unverified` taint and no `verified: false` attribute;
* allocated: named by an allocation result of a ResourceClaim (driver devices.fabricdra.io),
  not an admin-access one (`adminAccess: true` takes nothing: the allocator ignores it);
* free: healthy, verified and not allocated, on a node that takes pods now (capacity.py: Ready,
  not cordoned, no not-ready/unreachable/unschedulable taint; a slice without its Node: not
  free) — what placement may still hand out.

Stranded GPUs (free, yet no job that needs them whole can get them), each counted once:

* `computeDomain`: free GPUs on a node a ComputeDomain holds (one domain per node: they cannot
  join another domain);
* `nicsUnavailable`: free GPUs with no free RDMA NIC on their own `pciRoot` (other NICs of the
  node being free does not help: a GPU's own NIC is the one on its root); a GPU whose root has
  no NIC (or whose root is not published) looks at all the node's NICs.

Fragmentation, per fabric domain: `largestFit` is the largest N for which an N-node
ComputeDomain fits now (nodes whose GPUs are all free, that no ComputeDomain holds and that gang
placement counts: capacity.py, with `require_verified_nodes` as the controller's
`--require-verified-nodes`), less the nodes the gangs placed there still expect (as placement
counts them, a spanning gang's per-domain share included: capacity.expected_by_fabric); in
`none` at most 1 (no NVLink between its nodes), and
`freeGpusOnPartialNodes` the free GPUs sitting on nodes that are not whole.

Per switch tier (issue 28 point 4): for each value of each tier label on the Nodes
(`fabricdra.io/network.tier-1/-2/-3`, api/scaleout.py, nearest switch first) and for each NVLink
domain (tier `nvlink`): its nodes, free GPUs, `largestGang` (the whole nodes under it, over
every NVLink domain: a gang spanning domains under that switch) and `largestSegment` (the most
whole nodes under it inside one NVLink domain: one NVLink-local segment). What placed gangs
still expect of a domain is taken off that domain's whole nodes under every switch the domain
reaches (conservative where a domain straddles two switches). Nodes in `none` have no NVLink
fabric: their free GPUs count, but not towards a gang or segment.

Defragmentation (`defrag`): per NVLink domain, the workloads holding devices there, whose
eviction would free the whole domain; the unit is what one eviction frees: a ComputeDomain for
the nodes it holds (its job's pods go with it), else the Pods a claim is reserved for (a pod's
several claims are one workload), else the claim itself (allocated, reserved by no pod). The
fewest workloads first. Listing only: nothing here evicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabricdra.api import labels
from fabricdra.api.computedomain import gang_size
from fabricdra.api.scaleout import TIER_LABELS

from . import capacity
from .capacity import DRIVER, UNHEALTHY_TAINT, UNVERIFIED_TAINT, Device, allocate, devices

__all__ = [
    "DEFRAG_NOTE",
    "DRIVER",
    "UNHEALTHY_TAINT",
    "UNVERIFIED_TAINT",
    "Defrag",
    "Fleet",
    "defrag",
    "fleet",
]

NO_DOMAIN = "none"  # nodes whose GPUs are in no multi-node fabric domain
STRANDED_REASONS = ("computeDomain", "nicsUnavailable")


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
class NodeFacts:
    """What the tier rows and the defragmentation plan need of one node."""

    fabric: str
    tiers: tuple[str, ...]  # tier-1, tier-2, tier-3 label values ("" where unlabelled)
    gpus: int = 0
    free_gpus: int = 0
    whole: bool = False  # every GPU free, no ComputeDomain holds it, placement counts it
    wholeable: bool = False  # would be whole once every workload on it is evicted
    holder: str = ""  # the ComputeDomain ("namespace/name") that holds it


@dataclass
class Fleet:
    domains: dict[str, Domain]
    computeDomains: list[dict[str, Any]]
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    expected: dict[str, int] = field(default_factory=dict)  # fabric -> nodes gangs still expect
    gpu_keys: set[tuple[str, str]] = field(default_factory=set)  # (pool, device) of every GPU

    # The scale-out cabling check's verdicts (controller/tierlabels.py), from the Nodes.
    scaleOut: dict[str, Any] = field(default_factory=dict)

    def tiers(self) -> list[dict[str, Any]]:
        """One row per tier label value and per NVLink domain (see the module docstring)."""
        groups: dict[tuple[str, str], list[NodeFacts]] = {}
        for facts in self.nodes.values():
            for level, value in enumerate(facts.tiers):
                if value:
                    groups.setdefault((f"tier-{level + 1}", value), []).append(facts)
            if facts.fabric != NO_DOMAIN:
                groups.setdefault(("nvlink", facts.fabric), []).append(facts)
        rows = []
        for (tier, value), members in sorted(groups.items()):
            whole: dict[str, int] = {}
            for f in members:
                if f.fabric != NO_DOMAIN:
                    whole[f.fabric] = whole.get(f.fabric, 0) + f.whole
            room = {d: max(n - self.expected.get(d, 0), 0) for d, n in whole.items()}
            rows.append(
                {
                    "tier": tier,
                    "label": TIER_LABELS[int(tier[-1]) - 1] if tier != "nvlink" else "",
                    "name": value,
                    "nodes": len(members),
                    "fabricDomains": sorted(whole),
                    "freeGpus": sum(f.free_gpus for f in members),
                    "largestGang": sum(room.values()),
                    "largestSegment": max(room.values(), default=0),
                }
            )
        # The switch tiers nearest first, then the NVLink domains.
        rows.sort(key=lambda r: (r["tier"] == "nvlink", str(r["tier"]), str(r["name"])))
        return rows

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
            "tiers": self.tiers(),
            "computeDomains": self.computeDomains,
            "scaleOut": self.scaleOut,
        }


def _held_nodes(
    compute_domains: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Node -> the ComputeDomain ("namespace/name") holding it, and each domain's view."""
    held: dict[str, str] = {}
    views = []
    for cd in compute_domains:
        meta, status = cd.get("metadata") or {}, cd.get("status") or {}
        nodes = sorted(n.get("name", "") for n in status.get("nodes") or [] if n.get("name"))
        held.update(dict.fromkeys(nodes, f"{meta.get('namespace', '')}/{meta.get('name', '')}"))
        ready = next(
            (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
            "Unknown",
        )
        views.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "fabricDomain": status.get("fabricDomain") or "",
                "numNodes": gang_size(cd),
                "ready": ready,
                "nodes": nodes,
            }
        )
    views.sort(key=lambda v: (v["namespace"], v["name"]))
    return held, views


def _nic_stranded(gpu: Device, nics: list[Device]) -> bool:
    """No NIC the GPU can get as its own is free: those on its pciRoot, else (none there, or
    its root not published) any of the node's."""
    own = [n for n in nics if gpu.pci_root and n.pci_root == gpu.pci_root] or nics
    return bool(own) and not any(n.usable_nic for n in own)


def fleet(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    node_devices: Iterable[Mapping[str, Any]],
    compute_domains: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]] | None = None,
    *,
    require_verified_nodes: bool = False,
    require_fabric_verified: bool = False,
) -> Fleet:
    """`nodes`: the Node objects (None: every node is taken as able to run pods). A node is
    verified when its published gate is open (no device unverified): what the scheduler sees;
    its NodeDevices record only says why (with the agent's gate off nothing is closed, so it
    counts verified whatever an older record says). `node_devices` is kept for callers."""
    del node_devices
    by_key = devices(slices)
    allocate(by_key, claims)
    compute_domains = list(compute_domains)  # read twice: holders, and gangs' expectations
    held, cd_views = _held_nodes(compute_domains)
    node_objs = None if nodes is None else {n["metadata"]["name"]: n for n in nodes}

    def takes_pods(node: str, strict: bool = False) -> bool:
        """`strict`: also the gates gang placement is told to require."""
        if node_objs is None:
            return not strict
        obj = node_objs.get(node)
        return obj is not None and not capacity.unusable(
            dict(obj),
            require_verified=strict and require_verified_nodes,
            require_fabric_verified=strict and require_fabric_verified,
        )

    by_node: dict[str, list[Device]] = {}
    for d in by_key.values():
        by_node.setdefault(d.node, []).append(d)

    domains: dict[str, Domain] = {}
    view_nodes: dict[str, NodeFacts] = {}
    gated = require_verified_nodes or require_fabric_verified
    for node, node_devs in sorted(by_node.items()):
        labels_ = ((node_objs or {}).get(node, {}).get("metadata") or {}).get("labels") or {}
        view_nodes[node] = _add_node(
            domains,
            node,
            node_devs,
            labels_,
            holder=held.get(node, ""),
            up=takes_pods(node),
            # Cordoned, NotReady, tainted out or gone: nothing on it is free (no pod goes there).
            passes_gates=not gated or takes_pods(node, strict=True),
        )
    # The nodes gangs placed in a fabric domain still expect are not room for anyone else
    # (placement.free_nodes subtracts them the same way).
    expected_by = capacity.expected_by_fabric(compute_domains)
    for name, expected in expected_by.items():
        if name in domains and name != NO_DOMAIN:
            domains[name].largestFit = max(domains[name].largestFit - expected, 0)
    if NO_DOMAIN in domains:  # no NVLink between its nodes: a ComputeDomain of one at most
        domains[NO_DOMAIN].largestFit = min(domains[NO_DOMAIN].largestFit, 1)
    gpu_keys = {k for k, d in by_key.items() if d.type in capacity.GPU_TYPES}
    return Fleet(
        domains,
        cd_views,
        nodes=view_nodes,
        expected=expected_by,
        gpu_keys=gpu_keys,
        scaleOut=scale_out(node_objs.values() if node_objs else ()),
    )


def _add_node(
    domains: dict[str, Domain],
    node: str,
    node_devs: list[Device],
    node_labels: Mapping[str, Any],
    *,
    holder: str,
    up: bool,
    passes_gates: bool,
) -> NodeFacts:
    """Count one node and its devices in its fabric domain (made on first sight); its facts.
    `up`: it takes pods; `passes_gates`: also the gates gang placement is told to require."""
    gpus = [d for d in node_devs if d.type == "gpu"]
    nics = [d for d in node_devs if d.type in capacity.NIC_TYPES]
    fabric = sorted({d.fabric_domain for d in gpus if d.fabric_domain})
    # A node's NICs and MIG devices count under its GPUs' domain (one per node).
    domain = domains.setdefault(
        fabric[0] if fabric else NO_DOMAIN, Domain(fabric[0] if fabric else NO_DOMAIN)
    )
    domain.nodes += 1
    domain.verifiedNodes += all(d.verified for d in node_devs)
    whole = up and bool(gpus) and not holder and all(g.free for g in gpus) and passes_gates
    if whole:
        domain.largestFit += 1
    for d in node_devs:
        free = up and d.free
        c = domain.classes.setdefault(d.device_class, Counts())
        c.total += 1
        c.healthy += d.healthy
        c.verified += d.verified
        c.allocated += d.allocated
        c.free += free
        if d.type != "gpu" or not free:
            continue
        if holder:
            c.stranded["computeDomain"] += 1
        elif _nic_stranded(d, nics):
            c.stranded["nicsUnavailable"] += 1
        elif not whole:
            domain.freeGpusOnPartialNodes += 1
    return NodeFacts(
        fabric=domain.name,
        tiers=tuple(str(node_labels.get(t) or "") for t in TIER_LABELS),
        gpus=len(gpus),
        free_gpus=sum(1 for g in gpus if up and g.free),
        whole=whole,
        wholeable=up
        and bool(gpus)
        and all(g.healthy and g.verified for g in gpus)
        and passes_gates,
        holder=holder,
    )


def scale_out(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How many nodes carry tier labels, how many the cabling check judged, and each node it
    failed, by name, with its findings (the Node's fabricdra.io/network.cabling record)."""
    tiered = checked = 0
    failed = []
    for node in nodes:
        meta = node.get("metadata") or {}
        tiered += labels.TIER_1 in (meta.get("labels") or {})
        raw = (meta.get("annotations") or {}).get(labels.CABLING_CHECK)
        if not raw:
            continue
        checked += 1
        try:
            record = json.loads(raw)
        except ValueError:
            record = {"result": "Failed", "findings": [f"unreadable record: {raw[:80]}"]}
        if record.get("result") == "Failed":
            failed.append({"node": meta.get("name", ""), "findings": record.get("findings", [])})
    failed.sort(key=lambda f: f["node"])
    return {"tieredNodes": tiered, "checkedNodes": checked, "cablingFailed": failed}


# --- defragmentation: what to evict to free a whole NVLink domain ---------------------------

DEFRAG_NOTE = (
    "listing only: nothing is evicted. kube-scheduler does not preempt pods for DRA "
    "ResourceClaims (preemption frees CPU/memory/extended resources, not devices), so the "
    "eviction must come from the batch layer (Kueue, Slurm, your job controller) or a drain "
    "(kubectl drain / cordon the domain's nodes and delete the workloads listed)"
)


@dataclass
class Candidate:
    fabric: str
    workloads: list[dict[str, Any]]
    nodes: int
    nodes_freed: int

    def to_json(self) -> dict[str, Any]:
        return {
            "fabricDomain": self.fabric,
            "workloads": self.workloads,
            "evictedGpus": sum(w["gpus"] for w in self.workloads),
            "nodes": self.nodes,
            "nodesFreed": self.nodes_freed,
        }


@dataclass
class Defrag:
    candidates: list[Candidate]
    free_domains: list[str]

    def to_json(self) -> dict[str, Any]:
        fewest = (
            0
            if self.free_domains
            else min((len(c.workloads) for c in self.candidates), default=None)
        )
        return {
            "note": DEFRAG_NOTE,
            "fewestWorkloads": fewest,
            "freeDomains": self.free_domains,
            "candidates": [c.to_json() for c in self.candidates],
        }


def _workload(claim: Mapping[str, Any], holder: str) -> tuple[str, str, str]:
    """Who must go for the claim's devices to come free (the module docstring's unit)."""
    meta = claim.get("metadata") or {}
    ns = str(meta.get("namespace", ""))
    if holder:
        hns, _, hname = holder.partition("/")
        return ("ComputeDomain", hns, hname)
    pods = sorted(
        str(r.get("name", ""))
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods" and r.get("name")
    )
    if pods:  # a claim shared by several pods: they go together; named by the first
        return ("Pod", ns, pods[0] if len(pods) == 1 else ",".join(pods))
    return ("ResourceClaim", ns, str(meta.get("name", "")))


def defrag(view: Fleet, claims: Iterable[Mapping[str, Any]]) -> Defrag:
    """Per NVLink domain that is not free whole already, the workloads to evict to free it,
    fewest first (ties: fewest GPUs evicted, then name); domains where a node stays unusable
    whatever is evicted (unhealthy, unverified, cordoned) come after those freed whole."""
    by_domain: dict[str, dict[tuple[str, str, str], int]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            if r.get("driver") != DRIVER or r.get("adminAccess") is True:
                continue
            facts = view.nodes.get(str(r.get("pool", "")))
            if facts is None or facts.fabric == NO_DOMAIN:
                continue
            who = _workload(claim, facts.holder)
            held = by_domain.setdefault(facts.fabric, {})
            # Any device holds the node back (a NIC too); GPUs are what is counted.
            is_gpu = (str(r.get("pool", "")), str(r.get("device", ""))) in view.gpu_keys
            held[who] = held.get(who, 0) + is_gpu
    # A ComputeDomain holding nodes of a domain whose GPUs it has not claimed yet still holds them.
    for facts in view.nodes.values():
        if facts.holder and facts.fabric != NO_DOMAIN:
            hns, _, hname = facts.holder.partition("/")
            by_domain.setdefault(facts.fabric, {}).setdefault(("ComputeDomain", hns, hname), 0)
    members: dict[str, list[NodeFacts]] = {}
    for facts in view.nodes.values():
        if facts.fabric != NO_DOMAIN:
            members.setdefault(facts.fabric, []).append(facts)
    candidates, free = [], []
    for fabric, nodes in sorted(members.items()):
        held = by_domain.get(fabric, {})
        if not held:
            if all(n.whole for n in nodes):
                free.append(fabric)
            continue
        workloads = [
            {"kind": k, "namespace": ns, "name": name, "gpus": n}
            for (k, ns, name), n in sorted(
                held.items(), key=lambda kv: (_KIND_ORDER[kv[0][0]], kv[0])
            )
        ]
        candidates.append(
            Candidate(fabric, workloads, len(nodes), sum(1 for n in nodes if n.wholeable))
        )
    candidates.sort(
        key=lambda c: (
            c.nodes_freed < c.nodes,
            len(c.workloads),
            sum(w["gpus"] for w in c.workloads),
            c.fabric,
        )
    )
    return Defrag(candidates, free)


_KIND_ORDER = {"ComputeDomain": 0, "Pod": 1, "ResourceClaim": 2}
