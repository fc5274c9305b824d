"""The scale-out fabric's shared vocabulary (issue 27): the names the node agent publishes per
NIC, the tier labels the controller writes per node, and the operator's declared topology file
in its two accepted forms (Slurm's `topology.conf` tree form and a per-node/per-NIC YAML).

Pure: text in, typed records out. The node agent compares a NIC's declared coordinates with
what it measured; the controller joins the declared switch tree with the measured neighbours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from fabricdra.api.labels import PREFIX

# Per-device attributes (resource.k8s.io/v1 ResourceSlice, RDMA devices).
RAIL_ATTRIBUTE = "rail"
RAIL_SWITCH_ATTRIBUTE = "railSwitch"
NET_ROLE_ATTRIBUTE = "netRole"
SUBNET_ATTRIBUTE = "subnet"

# Node labels: the switch tiers above the node, nearest first, written by the controller.
TIER_LABELS = (PREFIX + "network.tier-1", PREFIX + "network.tier-2", PREFIX + "network.tier-3")

Role = Literal["compute", "storage", "frontend"]
ROLES: tuple[Role, ...] = ("compute", "storage", "frontend")
Source = Literal["measured", "declared"]

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def label_value(switch: str) -> str:
    """A switch id as a label value: itself when it is one (≤ 63 characters, alphanumeric at
    both ends, `-_.` inside), else a stable hash of it (the same id always gives the same value,
    on every node and in every release), so equal values still mean the same switch."""
    if _LABEL_VALUE.match(switch):
        return switch
    import hashlib  # here: importing it (OpenSSL) was ~3 % of `fabricdra inventory`'s start-up

    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", switch).strip("-_.")[:40].strip("-_.")
    digest = hashlib.sha256(switch.encode()).hexdigest()[:16]
    return f"{readable}-{digest}" if readable else f"h-{digest}"


class TopologyFileError(ValueError):
    """The topology file could not be read; the message names the line or key at fault."""


@dataclass(frozen=True)
class DeclaredNic:
    """What the operator declares about one NIC of one node. `nic` is how the file names it:
    a netdev (`ibp24s0`), an RDMA device (`mlx5_0`) or a PCI address (`0000:18:00.0`)."""

    node: str
    nic: str
    rail: int | None = None
    switch: str | None = None
    port: str | None = None
    role: Role | None = None


@dataclass(frozen=True)
class DeclaredTopology:
    """The operator's topology: the switch tree (each switch's parent), the leaf each node is
    cabled to, and per-NIC facts. Anything not declared is simply absent (never "none")."""

    parents: Mapping[str, str] = field(default_factory=dict)
    node_switch: Mapping[str, str] = field(default_factory=dict)
    nics: Mapping[tuple[str, str], DeclaredNic] = field(default_factory=dict)

    def tiers(self, node: str) -> tuple[str, ...]:
        """The switches above `node`, nearest first (leaf, spine, core, ...)."""
        chain: list[str] = []
        switch = self.node_switch.get(node)
        while switch is not None and switch not in chain:
            chain.append(switch)
            switch = self.parents.get(switch)
        return tuple(chain)

    def nic(self, node: str, names: Iterable[str]) -> DeclaredNic | None:
        """The declared NIC of `node` known by any of `names` (netdev, RDMA device, PCI)."""
        for name in names:
            found = self.nics.get((node, name))
            if found is not None:
                return found
        return None

    def nodes(self) -> set[str]:
        return set(self.node_switch) | {node for node, _ in self.nics}


# --- Slurm topology.conf, tree form ---------------------------------------------------------
# SwitchName=<name> [Switches=<hostlist>] [Nodes=<hostlist>] [LinkSpeed=<n>]
# (https://slurm.schedmd.com/topology.conf.html). Comments start with '#'.

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's hostlist syntax: `dgx[001-004,010],login1` → dgx001 … dgx004, dgx010, login1."""
    names: list[str] = []
    for part in _split_top_level(expr):
        match = re.match(r"^([^\[\]]*)\[([^\]]+)\]([^\[\]]*)$", part)
        if not match:
            if "[" in part or "]" in part:
                raise TopologyFileError(f"bad hostlist {expr!r}: cannot read {part!r}")
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            bounds = _RANGE.match(item.strip())
            if not bounds:
                raise TopologyFileError(f"bad hostlist {expr!r}: bad range {item!r}")
            low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
            if int(high) < int(low):
                raise TopologyFileError(f"bad hostlist {expr!r}: range {item!r} runs backwards")
            width = len(low)
            names.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), int(high) + 1))
    return names


def _split_top_level(expr: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in expr:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_slurm_tree(text: str) -> DeclaredTopology:
    """Slurm's topology.conf tree form: which nodes hang under which leaf, which switches
    under which. A node or switch under two parents is an error (the tree form forbids it)."""
    parents: dict[str, str] = {}
    node_switch: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep or not value:
                raise TopologyFileError(f"topology.conf line {number}: {token!r} is not Key=Value")
            fields[key.lower()] = value
        name = fields.get("switchname")
        if name is None:
            raise TopologyFileError(f"topology.conf line {number}: no SwitchName= (block form?)")
        for child in expand_hostlist(fields.get("switches", "")):
            _put(parents, child, name, f"topology.conf line {number}: switch")
        for node in expand_hostlist(fields.get("nodes", "")):
            _put(node_switch, node, name, f"topology.conf line {number}: node")
    return DeclaredTopology(parents=parents, node_switch=node_switch)


def _put(into: dict[str, str], key: str, value: str, where: str) -> None:
    if into.get(key, value) != value:
        raise TopologyFileError(f"{where} {key!r} is under both {into[key]!r} and {value!r}")
    into[key] = value


# --- The per-node / per-NIC YAML form --------------------------------------------------------


# Checked by hand, not with pydantic: the node agent and `fabricdra inventory` read this file
# on their start-up path, which imports no pydantic (tests/unit/test_inventory_startup.py).
_NIC_KEYS = {"rail", "switch", "port", "role"}
_NODE_KEYS = {"switch", "nics"}
_FILE_KEYS = {"switches", "nodes"}


def _mapping(value: object, where: str, keys: set[str] | None = None) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TopologyFileError(f"topology YAML: {where}: expected a mapping with string keys")
    if keys is not None and (extra := sorted(set(value) - keys)):
        raise TopologyFileError(f"topology YAML: {where}.{extra[0]}: unknown key")
    return value


def _text(value: object, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TopologyFileError(f"topology YAML: {where}: expected a string")
    return str(value)


def _nic(node: str, name: str, value: object, where: str) -> DeclaredNic:
    fields = _mapping(value, where, _NIC_KEYS)
    rail = fields.get("rail")
    if rail is not None and (isinstance(rail, bool) or not isinstance(rail, int) or rail < 0):
        raise TopologyFileError(f"topology YAML: {where}.rail: expected an integer 0 or more")
    role = fields.get("role")
    if role is not None and role not in ROLES:
        raise TopologyFileError(f"topology YAML: {where}.role: expected one of {', '.join(ROLES)}")
    return DeclaredNic(
        node,
        name,
        rail,
        _text(fields.get("switch"), f"{where}.switch"),
        _text(fields.get("port"), f"{where}.port"),
        role,  # checked against ROLES above
    )


def parse_yaml(text: str) -> DeclaredTopology:
    """The plain form:

    switches: {leaf-1: spine-a, spine-a: core}      # each switch's parent
    nodes:
      dgx001:
        switch: leaf-1                              # the node's nearest switch (tier 1)
        nics:
          mlx5_0: {rail: 0, switch: leaf-rail0, port: "17", role: compute}
    """
    import yaml  # only this form needs it

    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TopologyFileError(f"topology YAML does not parse: {err}") from err
    top = _mapping(loaded, "(top)", _FILE_KEYS)
    parents = {
        child: str(_text(parent, f"switches.{child}"))
        for child, parent in _mapping(top.get("switches"), "switches").items()
        if parent is not None
    }
    node_switch: dict[str, str] = {}
    nics: dict[tuple[str, str], DeclaredNic] = {}
    for node, entry in _mapping(top.get("nodes"), "nodes").items():
        fields = _mapping(entry, f"nodes.{node}", _NODE_KEYS)
        switch = _text(fields.get("switch"), f"nodes.{node}.switch")
        if switch:
            node_switch[node] = switch
        for name, nic in _mapping(fields.get("nics"), f"nodes.{node}.nics").items():
            nics[(node, name)] = _nic(node, name, nic, f"nodes.{node}.nics.{name}")
    return DeclaredTopology(parents=parents, node_switch=node_switch, nics=nics)


def parse_topology_file(text: str) -> DeclaredTopology:
    """Either form, told apart by its first meaningful line: Slurm's starts `SwitchName=`."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            if line.lower().startswith("switchname="):
                return parse_slurm_tree(text)
            break
    return parse_yaml(text)
