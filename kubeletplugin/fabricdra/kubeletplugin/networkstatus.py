"""The network status of the RDMA netdevs a claim was granted (KEP-4817), as dranet writes it:
`ResourceClaim.status.devices[]` entries `{driver, pool, device, shareID, networkData:
{interfaceName, ips, hardwareAddress}}`, so a workload (or a tool) can read which interface it
got and how it is addressed.

- `interfaceName`: the netdev of the granted endpoint (a VF has its own);
- `hardwareAddress`: `<sysfs>/class/net/<netdev>/address` (the host's sysfs, which the agent
  reads anyway: it names host interfaces whatever network namespace the agent runs in);
- `ips`: the interface's global-scope addresses in CIDR form (`10.0.0.5/24`; link-local and
  host-scope addresses say nothing off the node, as dranet also leaves them out), from the
  kernel over rtnetlink **in the host's network namespace** (`<proc>/1/ns/net`, entered by a
  short-lived thread of its own; the agent needs CAP_SYS_ADMIN for that, which its privileged
  container has). Where that namespace cannot be entered the addresses are those of the
  agent's own namespace when it is the host's (`node.hostNetwork`), else left out: an empty
  list would say "no address", which nothing measured.

The entries are written by server-side apply with field manager `devices.fabricdra.io` on the
status subresource: the apply names only this driver's entries, so other drivers' entries (and
their managers' fields) are left as they are. A device with no netdev (an RDMA device without
an interface) gets no entry. Writing is advice to readers, never a condition of prepare: a
failed write is logged and prepare goes on.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from fabricdra.kube.rest import CLAIMS, ApiError

from .devices import Device
from .kinds import kind_of
from .kubelet import current_call

log = structlog.get_logger("fabricdra.networkstatus")

DRIVER = "devices.fabricdra.io"
MAX_IPS = 16  # the API's limit per device
MAX_HARDWARE_ADDRESS = 128
MAX_INTERFACE_NAME = 256

# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h)
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_RTM_NEWADDR, _RTM_GETADDR = 20, 22
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_RT_SCOPE_UNIVERSE = 0
_CLONE_NEWNET = 0x40000000
WRITE_BUDGET = 5.0  # seconds the status write may take
DEADLINE_MARGIN = 2.0  # seconds kept before kubelet's deadline to answer


@dataclass(frozen=True, slots=True)
class Address:
    interface: str
    cidr: str  # "10.0.0.5/24", "2001:db8::5/64"
    scope: int  # 0 global, 253 link, 254 host


def dump_addresses() -> list[Address]:
    """Every address of the current network namespace, from the kernel (RTM_GETADDR)."""
    out: list[Address] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.bind((0, 0))
        request = struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0)  # ifaddrmsg
        header = struct.pack(
            "=IHHII", 16 + len(request), _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
        )
        s.sendall(header + request)
        while True:
            data = s.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, offset)
                if length < 16:
                    return out
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    (errno,) = struct.unpack_from("=i", data, offset + 16)
                    raise OSError(-errno, os.strerror(-errno))
                if kind == _RTM_NEWADDR:
                    address = _parse_address(data[offset + 16 : offset + length])
                    if address is not None:
                        out.append(address)
                offset += (length + 3) & ~3


def _parse_address(body: bytes) -> Address | None:
    family, prefix, _flags, scope, index = struct.unpack_from("=BBBBI", body, 0)
    attrs: dict[int, bytes] = {}
    offset = 8
    while offset + 4 <= len(body):
        alen, atype = struct.unpack_from("=HH", body, offset)
        if alen < 4:
            break
        attrs[atype] = body[offset + 4 : offset + alen]
        offset += (alen + 3) & ~3
    # IPv4 point-to-point links carry the peer in IFA_ADDRESS: the local address is IFA_LOCAL.
    raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
    if raw is None or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        name = socket.if_indextoname(index)
    except OSError:
        return None  # the interface went away meanwhile
    ip = ipaddress.ip_address(raw)
    return Address(name, f"{ip}/{prefix}", scope)


def host_addresses(proc_root: Path) -> list[Address] | None:
    """The addresses of the host's network namespace (that of `<proc_root>/1`), read by a
    thread that enters it; None when it cannot be entered and is not the agent's own."""
    target = proc_root / "1" / "ns" / "net"
    try:
        if os.stat(target).st_ino == os.stat("/proc/self/ns/net").st_ino:
            return dump_addresses()  # already there (hostNetwork, or a test)
    except OSError as e:
        log.warning("host network namespace unreadable: IPs left out", error=str(e))
        return None
    result: list[list[Address] | None] = [None]

    def enter_and_read() -> None:
        # setns changes only this thread's namespace; the thread ends right after.
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(target, os.O_RDONLY)
        except OSError as e:
            log.warning("host network namespace unreadable: IPs left out", error=str(e))
            return
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                log.warning(
                    "cannot enter the host network namespace: IPs left out",
                    error=os.strerror(err),
                )
                return
            result[0] = dump_addresses()
        finally:
            os.close(fd)

    t = threading.Thread(target=enter_and_read, name="host-netns-addresses", daemon=True)
    t.start()
    t.join()
    return result[0]


def network_data(
    netdev: str, sysfs_root: Path, addresses: Sequence[Address] | None
) -> dict[str, Any]:
    """One device's `networkData`; `addresses` None: unknown (no `ips` field)."""
    data: dict[str, Any] = {"interfaceName": netdev[:MAX_INTERFACE_NAME]}
    try:
        mac = (sysfs_root / "class" / "net" / netdev / "address").read_text().strip()
    except OSError:
        mac = ""
    if mac and len(mac) <= MAX_HARDWARE_ADDRESS:
        data["hardwareAddress"] = mac
    if addresses is not None:
        ips = [a.cidr for a in addresses if a.interface == netdev and a.scope == _RT_SCOPE_UNIVERSE]
        data["ips"] = list(dict.fromkeys(ips))[:MAX_IPS]
    return data


class Granted(Protocol):
    """One of this driver's allocation results (prepare's `Grant`): the device as allocated
    (a shared holder name on 1.34/1.35), its share id, and what it is."""

    @property
    def device_name(self) -> str: ...
    @property
    def share_id(self) -> str | None: ...
    @property
    def device(self) -> Device: ...


class NetworkStatus:
    """Writes the networkData of a claim's granted RDMA netdevs (the module docstring)."""

    def __init__(self, rest: Any, node_name: str, sysfs_root: Path, proc_root: Path) -> None:
        self.rest = rest
        self.node_name = node_name
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root

    def entries(self, granted: Sequence[Granted]) -> list[dict[str, Any]]:
        named = [(g, netdev) for g in granted if (netdev := kind_of(g.device).netdev(g.device))]
        if not named:
            return []
        addresses = host_addresses(self.proc_root)
        out = []
        for g, netdev in named:
            entry: dict[str, Any] = {
                "driver": DRIVER,
                "pool": self.node_name,
                "device": g.device_name,
                "networkData": network_data(str(netdev), self.sysfs_root, addresses),
            }
            if g.share_id is not None:
                entry["shareID"] = g.share_id
            out.append(entry)
        return out

    def write(self, namespace: str, name: str, granted: Sequence[Granted]) -> bool:
        """Apply the entries (none: nothing is sent) within what is left of kubelet's
        deadline for this call. False when the write failed or there was no time."""
        entries = self.entries(granted)
        if not entries:
            return True
        timeout = min(WRITE_BUDGET, current_call().remaining() - DEADLINE_MARGIN)
        if timeout <= 0:
            log.warning("no time left to write the claim's network status", claim=name)
            return False
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": entries},
        }
        try:
            self.rest.apply(
                CLAIMS,
                name,
                body,
                namespace,
                field_manager=DRIVER,
                sub="status",
                timeout=timeout,
                retries=False,
            )
        except ApiError as e:
            log.warning("cannot write the claim's network status", claim=name, error=str(e))
            return False
        return True
