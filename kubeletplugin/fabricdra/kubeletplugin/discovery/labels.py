"""The node labels that follow from the inventory, with every publish/withhold rule.

    rdma.capable   "true" while at least one endpoint (interface or VF) is usable; an endpoint
                   is usable when its verdict is anything but Failed, and with no verdict when
                   an RDMA device is bound. Absent otherwise: one broken NIC beside a working one
                   keeps the label; an unreadable tree (Unverified) keeps it too.
    rdma.distance  closest accelerator-usable-endpoint pair; absent with no accelerator (a
                   distance is a statement about a pair) or no usable endpoint.
    rdma.numa      NUMA nodes of the usable endpoints joined with `_` (a comma is not a label
                   character and a sanitiser would silently turn {0,1} into "01"); absent when
                   the kernel named no node for any of them.
    fabric.domain  set only when every accelerator reports the same domain.
    fabric.members set only when every accelerator reports the same non-zero count.

The result is the full desired set under fabricdra.io/, so a writer can remove what is no
longer reported, plus the keys whose inputs could not be read: a writer leaves those exactly
as published, because deleting on a failed read claims what the read could not support.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fabricdra.api import labels as keys
from fabricdra.api.inventory import Accelerator, Endpoint, Interface

from .distance import Distance, closest, distance

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class NodeLabels:
    desired: dict[str, str]
    unknown: frozenset[str]  # keys whose inputs failed: leave them as published
    rejected: dict[str, str]  # keys withheld because the value is not a valid label value


def is_valid_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.match(value) is not None


def usable(ep: Endpoint) -> bool:
    if ep.link is not None:
        return ep.link.verdict != "Failed"
    return ep.rdma


def effective_numa(ep: Endpoint, parent: Endpoint | None) -> int | None:
    """A VF with no affinity of its own falls back to its parent's: a blank is the kernel
    declining to answer, and the parent's node is the closest thing it did answer."""
    if ep.numaNode is not None or parent is None:
        return ep.numaNode
    return parent.numaNode


def usable_endpoints(interfaces: list[Interface]) -> list[tuple[Endpoint, int | None]]:
    out: list[tuple[Endpoint, int | None]] = []
    for iface in interfaces:
        if usable(iface):
            out.append((iface, iface.numaNode))
        for vf in iface.virtualFunctions:
            if usable(vf):
                out.append((vf, effective_numa(vf, iface)))
    return out


def compute_labels(
    interfaces: list[Interface] | None,
    accelerators: list[Accelerator] | None,
    fabric_readable: bool = True,
    members_readable: bool = True,
) -> NodeLabels:
    """`None` for a list means its enumeration failed. `fabric_readable` False means some
    accelerator's fabric could not be asked (e.g. NVML did not load on an NVIDIA node);
    `members_readable` False means some domain's size could not be counted (unreadable XGMI
    links): that key is then left as published rather than removed."""
    desired: dict[str, str] = {}
    unknown: set[str] = set()

    if interfaces is None:
        unknown |= {keys.RDMA_CAPABLE, keys.RDMA_NUMA, keys.RDMA_DISTANCE}
    else:
        endpoints = usable_endpoints(interfaces)
        if endpoints:
            desired[keys.RDMA_CAPABLE] = "true"
        numas = sorted({n for _, n in endpoints if n is not None})
        if numas:
            desired[keys.RDMA_NUMA] = "_".join(str(n) for n in numas)
        if accelerators is None:
            unknown.add(keys.RDMA_DISTANCE)
        else:
            pairs: list[Distance] = [
                distance(acc.topology, acc.numaNode, ep.topology, numa)
                for acc in accelerators
                for ep, numa in endpoints
            ]
            best = closest(pairs)
            if best is not None:
                desired[keys.RDMA_DISTANCE] = best

    if accelerators is None or not fabric_readable:
        unknown |= {keys.FABRIC_DOMAIN, keys.FABRIC_MEMBERS}
    elif accelerators:
        fabrics = [a.topology.fabric for a in accelerators]
        domains = {f.domain if f else None for f in fabrics}
        domain = domains.pop() if len(domains) == 1 else None
        if domain is not None:
            desired[keys.FABRIC_DOMAIN] = domain
            counts = {f.memberCount if f else None for f in fabrics}
            count = counts.pop() if len(counts) == 1 else None
            if not members_readable:
                # The domain is known but its size could not be counted: leave it as published.
                unknown.add(keys.FABRIC_MEMBERS)
            elif count:
                desired[keys.FABRIC_MEMBERS] = str(count)

    rejected = {k: v for k, v in desired.items() if not is_valid_label_value(v)}
    for k in rejected:
        del desired[k]
    return NodeLabels(desired=desired, unknown=frozenset(unknown), rejected=rejected)
