"""The interface inventory: every kernel network interface, starting from /sys/class/net.

Enumeration starts at the interface and resolves its device as an attribute of it. Walking the
PCI bus and correlating back could not see an interface that is not a PCI device at all, and
that is the case the inventory most needs: on some platforms the RDMA port is not on the bus.
Such an interface reports its own bus and leaves every PCI field empty.

SR-IOV virtual functions are nested under their physical function, never listed at top level.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricdra.api.inventory import Interface, LinkRecord, PciTopology, VirtualFunction

from .pci import PciFunction, read_function, subsystem
from .rdma import RdmaDevice, RdmaIndex
from .sysfs import Absent, SysfsTree, Unreadable

NET_CLASS = "class/net"
IFF_UP = 0x1


class EnumerationError(Exception):
    """The interface list itself could not be read: not the same as an empty list."""


@dataclass(frozen=True, slots=True)
class _Netdev:
    """What one class/net entry says about itself, before nesting."""

    name: str
    device_path: str | None
    bus: str
    virtual: bool
    mtu: int | None
    up: bool | None


def read_interfaces(tree: SysfsTree, rdma: RdmaIndex) -> list[Interface]:
    names = tree.listdir(NET_CLASS)
    if isinstance(names, Absent | Unreadable):
        raise EnumerationError(str(names))
    netdevs = [_read_netdev(tree, n) for n in names]
    by_device: dict[str, _Netdev] = {}
    for nd in netdevs:
        if nd.device_path is not None:
            by_device.setdefault(nd.device_path, nd)

    interfaces: list[Interface] = []
    for nd in netdevs:
        fn = read_function(tree, nd.device_path) if nd.bus == "pci" and nd.device_path else None
        if fn is not None and tree.exists(f"{fn.path}/physfn"):
            continue  # a VF: it appears nested under its physical function
        interfaces.append(_interface(tree, nd, fn, rdma, by_device))
    return sorted(interfaces, key=lambda i: i.name)


def _read_netdev(tree: SysfsTree, name: str) -> _Netdev:
    base = f"{NET_CLASS}/{name}"
    location = tree.resolve(base)
    # The kernel files software interfaces (lo, bridges, veth, bonds) under devices/virtual.
    virtual = isinstance(location, str) and location.startswith("devices/virtual/")
    device = tree.resolve(f"{base}/device")
    device_path = device if isinstance(device, str) and device else None
    bus = ""
    if device_path is not None:
        sub = subsystem(tree, device_path)
        bus = sub if isinstance(sub, str) else ""
    return _Netdev(
        name=name,
        device_path=device_path,
        bus=bus,
        virtual=virtual,
        mtu=_int_or_none(tree, f"{base}/mtu"),
        up=_is_up(tree, base),
    )


def _is_up(tree: SysfsTree, base: str) -> bool | None:
    """Administratively up and operationally not down. `unknown` is what lo and many virtual
    drivers report while passing traffic, so it counts as up when IFF_UP is set."""
    flags = tree.read_int(f"{base}/flags", 16)
    oper = tree.read(f"{base}/operstate")
    if isinstance(flags, Absent | Unreadable) or isinstance(oper, Absent | Unreadable):
        return None
    return bool(flags & IFF_UP) and oper in ("up", "unknown")


def _int_or_none(tree: SysfsTree, rel: str) -> int | None:
    v = tree.read_int(rel)
    return None if isinstance(v, Absent | Unreadable) else v


@dataclass(frozen=True, slots=True)
class _RdmaSide:
    """The RDMA facts of one endpoint, as the Endpoint record spells them."""

    rdma: bool = False
    rdmaDevice: str | None = None
    verbsDevice: str | None = None
    linkLayer: str | None = None
    link: LinkRecord | None = None


def _rdma_side(
    rdma: RdmaIndex, netdev: str | None, device_path: str | None, hardware: bool
) -> _RdmaSide:
    dev: RdmaDevice | None = rdma.for_endpoint(netdev, device_path)
    if dev is not None:
        return _RdmaSide(
            rdma=True,
            rdmaDevice=dev.name,
            verbsDevice=dev.verbs,
            linkLayer=dev.link_layer,
            link=dev.link,
        )
    if not rdma.readable and hardware:
        # The RDMA tree exists but could not be read: whether a device is bound is unknown.
        # Record that as Unverified (no device), never as a plain "no RDMA here".
        return _RdmaSide(link=LinkRecord(verdict="Unverified", reason=rdma.unreadable_reason))
    return _RdmaSide()


def _interface(
    tree: SysfsTree,
    nd: _Netdev,
    fn: PciFunction | None,
    rdma: RdmaIndex,
    by_device: dict[str, _Netdev],
) -> Interface:
    pf: bool | None = False
    vfs_configured: bool | None = None
    vfs: list[VirtualFunction] = []
    if fn is not None:
        total = tree.read_int(f"{fn.path}/sriov_totalvfs")
        # Absent: not SR-IOV capable. Unreadable: unknown, and its VFs (which are skipped at
        # top level) must still be looked for, or they would vanish from the inventory.
        pf = None if isinstance(total, Unreadable) else not isinstance(total, Absent) and total > 0
        if pf is not False:
            num = tree.read_int(f"{fn.path}/sriov_numvfs")
            vfs_configured = None if isinstance(num, Absent | Unreadable) else num > 0
            vfs = _virtual_functions(tree, fn, rdma, by_device)
    side = _rdma_side(rdma, nd.name, nd.device_path, hardware=not nd.virtual)
    return Interface(
        name=nd.name,
        bus=nd.bus,
        virtual=nd.virtual,
        pciBusId=fn.bus_id if fn else None,
        numaNode=fn.numa_node if fn else None,
        cpuAffinity=fn.cpu_affinity if fn else None,
        driver=fn.driver if fn else None,
        mtu=nd.mtu,
        up=nd.up,
        topology=fn.topology if fn else PciTopology(),
        sriovPhysicalFunction=pf if fn else None,
        sriovVfsConfigured=vfs_configured if fn else None,
        virtualFunctions=vfs,
        rdma=side.rdma,
        rdmaDevice=side.rdmaDevice,
        verbsDevice=side.verbsDevice,
        linkLayer=side.linkLayer,
        link=side.link,
    )


def _virtual_functions(
    tree: SysfsTree, pf: PciFunction, rdma: RdmaIndex, by_device: dict[str, _Netdev]
) -> list[VirtualFunction]:
    entries = tree.listdir(pf.path)
    if isinstance(entries, Absent | Unreadable):
        return []
    indexed = sorted(
        (int(e[len("virtfn") :]), e)
        for e in entries
        if e.startswith("virtfn") and e[len("virtfn") :].isdigit()
    )
    vfs: list[VirtualFunction] = []
    for index, entry in indexed:
        path = tree.resolve(f"{pf.path}/{entry}")
        if isinstance(path, Absent | Unreadable) or not path:
            continue
        fn = read_function(tree, path)
        nd = by_device.get(path)
        name = nd.name if nd else None
        side = _rdma_side(rdma, name, path, hardware=True)
        vfs.append(
            VirtualFunction(
                index=index,
                name=name,
                pciBusId=path.rsplit("/", 1)[1],
                numaNode=fn.numa_node if fn else None,
                cpuAffinity=fn.cpu_affinity if fn else None,
                driver=fn.driver if fn else None,
                mtu=nd.mtu if nd else None,
                up=nd.up if nd else None,
                # A VF shares its parent's upstream bridge path, so it inherits the coordinates.
                topology=pf.topology,
                rdma=side.rdma,
                rdmaDevice=side.rdmaDevice,
                verbsDevice=side.verbsDevice,
                linkLayer=side.linkLayer,
                link=side.link,
            )
        )
    return vfs
