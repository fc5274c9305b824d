"""InfiniBand port facts as the kernel lays them out under /sys/class/infiniband/<dev>/ports/<n>/
(drivers/infiniband/core/sysfs.c,
https://github.com/torvalds/linux/blob/master/drivers/infiniband/core/sysfs.c):

    gids/0     `%pI6`: eight groups of four hex digits,
               e.g. fe80:0000:0000:0000:0c42:a103:0012:3456; GID 0 is the subnet prefix
               (first 64 bits) and the port GUID (last 64 bits)
    lid        `0x%x` (the port's LID; 0 until the subnet manager assigns one)
    sm_lid     `0x%x` (the LID of the subnet manager this port answers to)
    rate       `%d%s Gb/sec (%dX %s)`, e.g. `400 Gb/sec (4X NDR)`

An Ethernet (RoCE) port has gids/0 too, but it is derived from the netdev's MAC address and says
nothing about a subnet, so only InfiniBand ports report GUID, prefix and LIDs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..rdma import IB_CLASS
from ..sysfs import Absent, SysfsTree, Unreadable

_GID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec\b")


@dataclass(frozen=True, slots=True)
class IbPort:
    port: int
    port_guid: str | None = None
    subnet_prefix: str | None = None
    lid: int | None = None
    sm_lid: int | None = None
    rate_gbps: float | None = None
    errors: tuple[str, ...] = ()  # files that exist but could not be read or parsed


def parse_gid(text: str) -> tuple[str, str]:
    """`fe80:0000:…:3456` -> (subnet prefix, port GUID) as `0x` + 16 hex digits each."""
    gid = text.strip().lower()
    if not _GID.match(gid):
        raise ValueError(f"not a GID in the kernel's %pI6 form: {text!r}")
    digits = gid.replace(":", "")
    return "0x" + digits[:16], "0x" + digits[16:]


def parse_rate(text: str) -> float:
    """`400 Gb/sec (4X NDR)` -> 400.0; `2.5 Gb/sec (1X SDR)` -> 2.5."""
    match = _RATE.match(text.strip())
    if not match:
        raise ValueError(f"not a port rate: {text!r}")
    return float(match.group(1))


def read_port(tree: SysfsTree, device: str, port: int, infiniband: bool) -> IbPort:
    base = f"{IB_CLASS}/{device}/ports/{port}"
    errors: list[str] = []

    def text(name: str) -> str | None:
        value = tree.read(f"{base}/{name}")
        if isinstance(value, Absent):
            return None
        if isinstance(value, Unreadable):
            errors.append(f"{name}: {value}")
            return None
        return value

    rate: float | None = None
    raw_rate = text("rate")
    if raw_rate is not None:
        try:
            rate = parse_rate(raw_rate)
        except ValueError as e:
            errors.append(f"rate: {e}")
    if not infiniband:
        return IbPort(port=port, rate_gbps=rate, errors=tuple(errors))
    prefix = guid = None
    raw_gid = text("gids/0")
    if raw_gid is not None:
        try:
            prefix, guid = parse_gid(raw_gid)
        except ValueError as e:
            errors.append(f"gids/0: {e}")
    lids: dict[str, int | None] = {}
    for name in ("lid", "sm_lid"):
        raw = text(name)
        lids[name] = None
        if raw is not None:
            try:
                lids[name] = int(raw.strip(), 16)
            except ValueError:
                errors.append(f"{name}: not a hex LID: {raw!r}")
    return IbPort(
        port=port,
        port_guid=guid,
        subnet_prefix=prefix,
        lid=lids["lid"],
        sm_lid=lids["sm_lid"],
        rate_gbps=rate,
        errors=tuple(errors),
    )
