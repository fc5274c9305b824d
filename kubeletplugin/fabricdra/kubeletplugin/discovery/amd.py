"""AMD XGMI hive membership from the KFD topology in sysfs.

Each KFD node's `properties` file lists `key value` lines; GPU nodes carry `location_id`
((bus << 8) | devfn), `domain`, `hive_id` (0 = in no hive) and, on kernels that print it,
`unique_id` (the GPU's serial, in decimal). XGMI peers are the node's
io_links of type 11. The hive size a GPU reports is itself plus its XGMI peers.

A count needs every link read: when the io_links (or one link's properties) cannot be read the
peer count is unknown (None), never the number that happened to be readable. A KFD node whose
properties cannot be read is named in `unreadable`, so the caller knows some GPU's hive went
unasked rather than concluding it is in none.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sysfs import Absent, SysfsTree, Unreadable

KFD_NODES = "class/kfd/kfd/topology/nodes"
IO_LINK_TYPE_XGMI = 11


@dataclass(frozen=True, slots=True)
class XgmiReading:
    hive_id: int
    peers: int | None  # None: the io_links could not all be read, so the count is unknown
    # The GPU's serial as KFD prints it (`unique_id`, decimal; kfd_topology.c); None where the
    # kernel prints none or 0 (the amdgpu backend's second source for `uuid`).
    unique_id: int | None = None


@dataclass(frozen=True, slots=True)
class KfdReadings:
    available: bool
    reason: str | None
    by_bus_id: dict[str, XgmiReading]
    unreadable: tuple[str, ...] = ()  # KFD nodes whose properties could not be read


def _properties(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


def read_kfd(tree: SysfsTree) -> KfdReadings:
    nodes = tree.listdir(KFD_NODES)
    if isinstance(nodes, Absent | Unreadable):
        return KfdReadings(available=False, reason=str(nodes), by_bus_id={})
    out: dict[str, XgmiReading] = {}
    unreadable: list[str] = []
    for node in nodes:
        text = tree.read(f"{KFD_NODES}/{node}/properties")
        if isinstance(text, Unreadable):
            unreadable.append(node)
            continue
        if isinstance(text, Absent):
            continue
        props = _properties(text)
        location = props.get("location_id")
        if not props.get("gpu_id") and not props.get("simd_count"):
            continue  # a CPU node
        if location is None:
            continue
        bus_id = (
            f"{props.get('domain', 0):04x}:{location >> 8:02x}:"
            f"{(location >> 3) & 0x1F:02x}.{location & 0x7}"
        )
        out[bus_id] = XgmiReading(
            hive_id=props.get("hive_id", 0),
            peers=_xgmi_peers(tree, node),
            unique_id=props.get("unique_id") or None,
        )
    return KfdReadings(available=True, reason=None, by_bus_id=out, unreadable=tuple(unreadable))


def _xgmi_peers(tree: SysfsTree, node: str) -> int | None:
    # The kernel creates io_links for every node, so a missing directory is no answer of zero.
    links = tree.listdir(f"{KFD_NODES}/{node}/io_links")
    if isinstance(links, Absent | Unreadable):
        return None
    peers: set[int] = set()
    for link in links:
        text = tree.read(f"{KFD_NODES}/{node}/io_links/{link}/properties")
        if isinstance(text, Absent | Unreadable):
            return None
        props = _properties(text)
        if props.get("type") == IO_LINK_TYPE_XGMI and "node_to" in props:
            peers.add(props["node_to"])
    return len(peers)
