"""RDMA devices, which network endpoint each is bound to, and the link verdict.

`rdma: true` says an RDMA device is bound; it does not say the link works. The verdict reads
each port's `state` and `phys_state` through the RDMA subsystem's own attributes, so it is the
same for every vendor:

    port up       state is exactly ACTIVE and phys_state is exactly LinkUp
    port down     both files read, and the port is not up (ACTIVE_DEFER is not ACTIVE)
    port unknown  either file absent, unreadable or not of the `N: NAME` form

    OK          at least one port is up
    Unverified  no port is up and at least one is unknown (or the device shows no ports):
                "all ports are down" is not established, and an inability to ask is not a no
    Failed      every port is down; carries the readings verbatim and when it was first seen
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from fabricdra.api.inventory import LinkRecord, PortReading

from .sysfs import Absent, Failure, SysfsTree, Unreadable

IB_CLASS = "class/infiniband"
VERBS_CLASS = "class/infiniband_verbs"


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    name: str
    device_path: str | None  # resolved path of the device it hangs off, when it has one
    netdevs: frozenset[str]  # netdevs its ports name in gid_attrs/ndevs/0
    verbs: str | None
    link_layer: str | None
    link: LinkRecord


@dataclass(slots=True)
class RdmaIndex:
    """Every RDMA device on the node, indexed the two ways an endpoint can be matched to one."""

    readable: bool = True
    unreadable_reason: str | None = None
    devices: list[RdmaDevice] = field(default_factory=list)
    _by_netdev: dict[str, RdmaDevice] = field(default_factory=dict)
    _by_path: dict[str, list[RdmaDevice]] = field(default_factory=dict)

    def add(self, dev: RdmaDevice) -> None:
        self.devices.append(dev)
        for nd in dev.netdevs:
            self._by_netdev.setdefault(nd, dev)
        if dev.device_path is not None:
            self._by_path.setdefault(dev.device_path, []).append(dev)

    def for_endpoint(self, netdev: str | None, device_path: str | None) -> RdmaDevice | None:
        """The port's own netdev binding is exact (it tells apart the ports of a multi-port
        device); the shared device path is the fallback (IPoIB GIDs name no netdev)."""
        if netdev is not None and netdev in self._by_netdev:
            return self._by_netdev[netdev]
        if device_path is not None:
            candidates = self._by_path.get(device_path, [])
            if len(candidates) == 1:
                return candidates[0]
        return None


def parse_enum(value: str) -> str | None:
    """`4: ACTIVE` -> `ACTIVE`; the whole enum name, never a substring."""
    number, sep, name = value.partition(":")
    if not sep or not number.strip().isdigit() or not name.strip():
        return None
    return name.strip()


def _port_status(state: str | None, phys: str | None) -> str:
    if state is None or phys is None:
        return "unknown"
    s, p = parse_enum(state), parse_enum(phys)
    if s is None or p is None:
        return "unknown"
    return "up" if (s == "ACTIVE" and p == "LinkUp") else "down"


def verdict(ports: list[PortReading], ports_failure: Failure | None, now: datetime) -> LinkRecord:
    """The link verdict for one device from its port readings (None values = unreadable)."""
    if ports_failure is not None:
        return LinkRecord(verdict="Unverified", reason=f"ports not readable: {ports_failure}")
    if not ports:
        return LinkRecord(verdict="Unverified", reason="device shows no ports")
    statuses = [_port_status(p.state, p.physState) for p in ports]
    if "up" in statuses:
        return LinkRecord(verdict="OK", ports=ports)
    if "unknown" in statuses:
        return LinkRecord(
            verdict="Unverified",
            ports=ports,
            reason="no port is up and not every port could be read",
        )
    return LinkRecord(verdict="Failed", ports=ports, since=now, reason="every port is down")


def read_rdma_index(tree: SysfsTree, now: datetime) -> RdmaIndex:
    names = tree.listdir(IB_CLASS)
    if isinstance(names, Absent):
        return RdmaIndex()  # no RDMA subsystem: a reading of "none", not a failure
    if isinstance(names, Unreadable):
        return RdmaIndex(readable=False, unreadable_reason=str(names))
    verbs = _read_verbs(tree)
    index = RdmaIndex()
    for name in names:
        dev = _read_device(tree, name, verbs.get(name), now)
        index.add(dev)
        where = tree.resolve(f"{IB_CLASS}/{name}/device")
        if dev.device_path is None and not dev.netdevs and isinstance(where, Unreadable):
            # A device nobody can bind to an endpoint: any endpoint without a device may be its
            # own, so "no RDMA device here" is no longer an answer for them (see interfaces).
            index.readable = False
            index.unreadable_reason = f"RDMA device {name} could not be read: {where}"
    return index


def _read_verbs(tree: SysfsTree) -> Mapping[str, str]:
    """ibdev name -> uverbsN, from class/infiniband_verbs/*/ibdev."""
    entries = tree.listdir(VERBS_CLASS)
    if isinstance(entries, Absent | Unreadable):
        return {}
    out: dict[str, str] = {}
    for entry in entries:
        ibdev = tree.read(f"{VERBS_CLASS}/{entry}/ibdev")
        if isinstance(ibdev, str) and ibdev:
            out.setdefault(ibdev, entry)
    return out


def _read_device(tree: SysfsTree, name: str, verbs: str | None, now: datetime) -> RdmaDevice:
    base = f"{IB_CLASS}/{name}"
    device = tree.resolve(f"{base}/device")
    device_path = device if isinstance(device, str) and device else None
    port_names = tree.listdir(f"{base}/ports")
    ports: list[PortReading] = []
    netdevs: set[str] = set()
    link_layer: str | None = None
    ports_failure: Failure | None = None
    if isinstance(port_names, Absent | Unreadable):
        ports_failure = port_names
    else:
        for p in sorted(
            port_names, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s)
        ):
            if not p.isdigit():
                continue
            pbase = f"{base}/ports/{p}"
            state = tree.read(f"{pbase}/state")
            phys = tree.read(f"{pbase}/phys_state")
            ports.append(
                PortReading(
                    port=int(p),
                    state=state if isinstance(state, str) else None,
                    physState=phys if isinstance(phys, str) else None,
                )
            )
            ndev = tree.read(f"{pbase}/gid_attrs/ndevs/0")
            if isinstance(ndev, str) and ndev:
                netdevs.add(ndev)
            if link_layer is None:
                ll = tree.read(f"{pbase}/link_layer")
                if isinstance(ll, str) and ll:
                    link_layer = ll
    return RdmaDevice(
        name=name,
        device_path=device_path,
        netdevs=frozenset(netdevs),
        verbs=verbs,
        link_layer=link_layer,
        link=verdict(ports, ports_failure, now),
    )


def merge_first_seen(current: LinkRecord, previous: LinkRecord | None) -> LinkRecord:
    """Keep the first-seen time of a failure that persists. Taking the clock every pass would
    make an unchanged node compare unequal, and rewrite the record forever."""
    if (
        current.verdict == "Failed"
        and previous is not None
        and previous.verdict == "Failed"
        and previous.since is not None
    ):
        return current.model_copy(update={"since": previous.since})
    return current
