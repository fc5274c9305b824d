"""Which GPUs of this node reach each other over NVLink (the `nvlinkGroup` attribute).

Inside one node GPUs are joined over NVLink in one of three ways: through NVSwitch chips on an
HGX/DGX baseboard (every GPU has links to every switch, so all GPUs of the board reach each
other), directly over NVLink bridges (PCIe cards bridged in pairs), or not at all. NVML says,
for each active link, what is at its far end (`nvmlDeviceGetNvLinkRemotePciInfo`, and
`nvmlDeviceGetNvLinkRemoteDeviceType`: a GPU or an NVSwitch), recorded in the snapshot as
`nvlinks[].remoteBusId` / `remoteType`.

The groups are the connected components of the graph whose vertices are this node's GPUs and
the NVSwitches their links name, and whose edges are the **active** links whose far end NVML
identified. Only what was measured joins: an inactive link, a link whose far end NVML did not
name (no bus id, the all-zero id, or a type other than GPU/NVSwitch), or a far GPU that NVML
does not report on this node joins nothing. A GPU in no group with another GPU gets no group:
a group of one would promise nothing, and "no NVLink" must never read as "close".

A group's name is the lowest GPU bus id in it (`0000:18:00.0`): stable while the links are,
and unique within the node, which is all a `matchAttribute` needs (a claim's node-local
devices all come from one node). It says nothing about the multi-node NVLink fabric (the
`fabricDomain` attribute, from the GPU's fabric registration), which spans nodes.
"""

from __future__ import annotations

from .nvml import NvmlReadings, normalise_bus_id

_NO_BUS = "0000:00:00.0"


def nvlink_groups(nvml: NvmlReadings | None) -> dict[str, str]:
    """GPU bus id -> its NVLink group, for GPUs that reach at least one other GPU."""
    if nvml is None or not nvml.available:
        return {}
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    gpus = set(nvml.gpus)
    for bus, gpu in nvml.gpus.items():
        find(bus)
        for link in gpu.nvlinks or ():
            if not link.active or not link.remoteBusId:
                continue
            remote = normalise_bus_id(link.remoteBusId)
            if remote == _NO_BUS:
                continue
            if link.remoteType == "gpu" and remote in gpus and remote != bus:
                union(bus, remote)
            elif link.remoteType == "switch":
                union(bus, f"switch {remote}")  # its own vertex: never a GPU's bus id

    members: dict[str, list[str]] = {}
    for bus in gpus:
        members.setdefault(find(bus), []).append(bus)
    out: dict[str, str] = {}
    for group in members.values():
        if len(group) < 2:
            continue
        name = min(group)
        for bus in group:
            out[bus] = name
    return out
