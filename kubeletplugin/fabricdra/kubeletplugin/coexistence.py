"""Never hand out a device twice: the devices another advertiser already offers on this node.

Pure: the Node object and the RDMA subsystem's namespace mode in, what to withhold out. The
agent (agent.py) applies it to each pass's inventory, so the ResourceSlices, prepare and the
health stream all leave the withheld devices out (docs/coexistence.md).

**Device plugins** are seen in the Node's `status.capacity`: kubelet lists there every resource
a registered device plugin advertises, with its device count. A resource of the table below
with a count above 0 means a device plugin hands out that group's devices on this node, so
fabricdra withholds the whole group (a plugin's device ids are its own: NVIDIA's are GPU
UUIDs, the RDMA shared plugin's are made up, the SR-IOV plugin's PCI addresses — there is no
common key to refuse one device by). Capacity, not allocatable: a plugin that marks a device
unhealthy takes it out of allocatable only, and still owns it. A count of 0 is a plugin that
has gone (kubelet keeps the name at 0 until it restarts): absent. Why the Node and not the
kubelet's pod-resources socket: the agent reads its Node already (the RDMA mode label; one
read, off the pass's path, apifacts.py: the pass applies the last reading), it needs no other
host mount (the socket would show every pod's devices on the node to this pod), and the answer
is the same one the scheduler acts on.

**RDMA namespace mode.** In exclusive mode (`rdma system set netns exclusive`, or the boot
parameter `ib_core.netns_mode=0`) an RDMA device belongs to one network namespace, and the
kernel refuses to open its verbs device (`ib_uverbs_open`: EPERM) from any other: a pod in its
own network namespace cannot use the `uverbsN` a claim hands it unless something moved the
RDMA device into that namespace (dranet, the RDMA CNI of SR-IOV setups). So in exclusive mode
fabricdra withholds its RDMA endpoints and EFA functions. The mode is read from
`/sys/module/ib_core/parameters/netns_mode`, the module parameter bound to the very variable
`rdma system set netns` changes (drivers/infiniband/core/device.c, `ib_devices_shared_netns`):
`Y` shared, `N` exclusive; no file, no ib_core (no RDMA device either)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from . import kinds
from .devices import Device, DeviceInventory
from .discovery.sysfs import Absent, SysfsTree, Unreadable

# A group of this node's devices one device plugin would hand out: each kind names its own
# (kinds/base.py `plugin_group`); NVIDIA's GPU and MIG kinds share one.
Group = str
GROUPS: tuple[Group, ...] = tuple(
    dict.fromkeys(k.plugin_group for k in kinds.KINDS if k.plugin_group is not None)
)
NetnsMode = Literal["shared", "exclusive"]

NETNS_MODE_PARAM = "module/ib_core/parameters/netns_mode"  # under the sysfs root


@dataclass(frozen=True)
class Rule:
    """A device plugin resource name (`*` at the end: any name with that start) standing for
    this node's devices of `group`."""

    group: Group
    resource: str

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.resource)


# The names the ecosystem's device plugins advertise by default, from the kinds
# (`device_plugin_resources`; docs/coexistence.md).
BUILTIN_RULES: tuple[Rule, ...] = tuple(
    dict.fromkeys(
        Rule(k.plugin_group, resource)
        for k in kinds.KINDS
        if k.plugin_group is not None
        for resource in k.device_plugin_resources
    )
)


def parse_rule(text: str) -> Rule:
    """`GROUP=RESOURCE` (the `--device-plugin-resource` flag), e.g.
    `rdma=nvidia.com/sriov_rdma_vf` for an SR-IOV device plugin pool."""
    name, sep, resource = text.partition("=")
    name, resource = name.strip(), resource.strip()
    if not sep or not resource:
        raise ValueError(f"device plugin resource {text!r} is not GROUP=RESOURCE")
    if name not in GROUPS:
        raise ValueError(
            f"device plugin resource {text!r}: group {name!r} is not one of {', '.join(GROUPS)}"
        )
    if "/" not in resource.rstrip("*"):
        raise ValueError(
            f"device plugin resource {text!r}: {resource!r} is not a resource name "
            "(domain/name, e.g. nvidia.com/sriov_rdma_vf)"
        )
    return Rule(name, resource)


@dataclass(frozen=True)
class Conflict:
    """One reason a group of this node's devices is withheld."""

    group: Group
    reason: str  # the advertised resource and count, or the RDMA namespace mode

    def __str__(self) -> str:
        return f"{self.group}: {self.reason}"


def _count(value: object) -> bool:
    """Whether a capacity quantity is above 0 (device plugins advertise whole counts; any
    other spelling is taken as present, never as nothing)."""
    text = str(value).strip()
    try:
        return int(text) > 0
    except ValueError:
        return text not in ("", "0")


def device_plugin_conflicts(node: Mapping[str, Any], rules: Iterable[Rule]) -> list[Conflict]:
    """The groups a device plugin advertises on this Node (`status.capacity`, count > 0)."""
    capacity = ((node.get("status") or {}).get("capacity")) or {}
    rules = tuple(rules)
    out: list[Conflict] = []
    for name in sorted(capacity):
        if not _count(capacity[name]):
            continue
        for group in dict.fromkeys(r.group for r in rules if r.matches(name)):
            out.append(Conflict(group, f"device plugin resource {name}={capacity[name]}"))
    return out


def netns_conflicts(mode: NetnsMode | None) -> list[Conflict]:
    if mode != "exclusive":
        return []
    why = "RDMA subsystem in exclusive network-namespace mode (rdma system netns exclusive)"
    return [Conflict("rdma", why), Conflict("efa", why)]


def parse_netns_mode(text: str) -> NetnsMode:
    value = text.strip()
    if value in ("Y", "1"):
        return "shared"
    if value in ("N", "0"):
        return "exclusive"
    raise ValueError(f"{NETNS_MODE_PARAM} reads {value!r}, not Y or N")


def read_netns_mode(tree: SysfsTree) -> NetnsMode | None:
    """This host's RDMA namespace mode; None: no ib_core loaded (no RDMA device either).
    Raises ValueError when the file is there but cannot be read or makes no sense: unknown
    is never taken for shared."""
    reading = tree.read(NETNS_MODE_PARAM)
    if isinstance(reading, Absent):
        return None
    if isinstance(reading, Unreadable):
        raise ValueError(str(reading))
    return parse_netns_mode(reading)


def group_of(device: Device) -> Group | None:
    """The group a device plugin would hand `device` out as (its kind's); None: none."""
    return kinds.kind_of(device).plugin_group


def withhold(
    inventory: DeviceInventory, conflicts: Sequence[Conflict]
) -> tuple[DeviceInventory, dict[Group, list[str]]]:
    """The inventory without the conflicting groups' devices, and the names withheld per
    group (only groups that had devices here)."""
    groups = {c.group for c in conflicts}
    if not groups:
        return inventory, {}
    kept: list[Device] = []
    dropped: dict[Group, list[str]] = {}
    for d in inventory:
        group = group_of(d)
        if group is not None and group in groups:
            dropped.setdefault(group, []).append(d.name)
        else:
            kept.append(d)
    if not dropped:
        return inventory, {}
    return replace(inventory, devices=tuple(kept)), dropped
