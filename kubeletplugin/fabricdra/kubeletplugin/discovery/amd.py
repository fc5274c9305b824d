"""AMD XGMI hive membership from the KFD topology in sysfs.

Each KFD node's `properties` file lists `key value` lines; GPU nodes carry `location_id`
((bus << 8) | devfn), `domain` and `hive_id` (0 = in no hive). XGMI peers are the node's
io_links of type 11. The hive size a GPU reports is itself plus its XGMI peers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sysfs import Absent, SysfsTree, Unreadable

KFD_NODES = "class/kfd/kfd/topology/nodes"
IO_LINK_TYPE_XGMI = 11


@dataclass(frozen=True, slots=True)
class XgmiReading:
    hive_id: int
    peers: int


@dataclass(frozen=True, slots=True)
class KfdReadings:
    available: bool
    reason: str | None
    by_bus_id: dict[str, XgmiReading]


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
    for node in nodes:
        text = tree.read(f"{KFD_NODES}/{node}/properties")
        if isinstance(text, Absent | Unreadable):
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
        out[bus_id] = XgmiReading(hive_id=props.get("hive_id", 0), peers=_xgmi_peers(tree, node))
    return KfdReadings(available=True, reason=None, by_bus_id=out)


def _xgmi_peers(tree: SysfsTree, node: str) -> int:
    links = tree.listdir(f"{KFD_NODES}/{node}/io_links")
    if isinstance(links, Absent | Unreadable):
        return 0
    peers: set[int] = set()
    for link in links:
        text = tree.read(f"{KFD_NODES}/{node}/io_links/{link}/properties")
        if isinstance(text, Absent | Unreadable):
            continue
        props = _properties(text)
        if props.get("type") == IO_LINK_TYPE_XGMI and "node_to" in props:
            peers.add(props["node_to"])
    return len(peers)
