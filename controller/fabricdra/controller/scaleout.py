"""The scale-out tree (issue 27 points 4 and 5): which switches sit above each node, and
whether its cabling is what a rail-optimised fabric wants. Pure: records in, verdicts out.

Inputs:
- each node's RDMA NICs as its NodeDevices record publishes them (`spec.interfaces[].scaleOut`,
  filled by the node agent: the neighbour switch each NIC is cabled to, its rail and role);
- `ibnetdiscover` dumps, one per InfiniBand fabric (the switches, their links, and which CA port
  hangs under which switch port): what a host cannot see, the tiers above its leaf;
- the operator's topology file (api/scaleout.py): switch parents and node leaves, declared.

A node's tier-1 is its block: the leaf it is cabled to, or for a rail-optimised node whose
compute NICs reach one leaf per rail, the set of those leaves (the rail group or scalable
unit). Tier-2 is the set of switches one level above the block's leaves, tier-3 the set above
those. A set of one switch is named by the switch's id; a larger set by its sorted ids, hashed
beyond 63 characters (api/scaleout.label_value), so equal values mean the same switches.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabricdra.api.scaleout import DeclaredTopology, label_value

# --- ibnetdiscover ---------------------------------------------------------------------------
# The format is what rdma-core's infiniband-diags/ibnetdiscover.c prints (out_switch,
# out_switch_port, out_ca, out_ca_port; https://github.com/linux-rdma/rdma-core/blob/master/
# infiniband-diags/ibnetdiscover.c, man page ibnetdiscover(8)): one block per node, a header
#   Switch  41 "S-b8599f0300f3c6a0"   # "MF0;leaf01:MQM9700/U1" enhanced port 0 lid 5 lmc 0
#   Ca      1 "H-0c42a10300a1b2c0"    # "dgx001 mlx5_0"
# then one line per connected port, the local port first, then the peer:
#   [1]     "H-0c42a10300a1b2c0"[1](c42a10300a1b2c1)   # "dgx001 mlx5_0" lid 12 4xNDR
#   [1](c42a10300a1b2c1)   "S-b8599f0300f3c6a0"[1]     # lid 12 lmc 0 "MF0;leaf01..." lid 5 4xNDR
# A CA port carries its port GUID in parentheses; a switch port does not (all of a switch's
# ports share the node GUID). Header lines (vendid=, devid=, sysimgguid=, switchguid=, caguid=,
# rtguid=) and the grouping (-g) section titles carry nothing the tree needs.


class FabricDumpError(ValueError):
    """The dump could not be read; the message names the line at fault."""


_HEADER = re.compile(
    r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9A-Fa-f]+)"\s*(?:#\s*"((?:[^"\\]|\\.)*)")?'
)
_PORT = re.compile(
    r"^\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9A-Fa-f]+)\))?\s*"
    r'"([SHR])-([0-9A-Fa-f]+)"\[(\d+)\](?:\[ext \d+\])?\s*(?:\(([0-9A-Fa-f]+)\))?'
    r'\s*(?:#\s*(?:"((?:[^"\\]|\\.)*)")?)?'
)
_SKIP = re.compile(
    r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=|^Hostname:|^Chassis\b|"
    r"^Non-Chassis Nodes"
)


def guid(text: str) -> str:
    """A GUID in one spelling, `0x` and 16 lowercase hex digits, whichever way it was written
    (`0x0c42…`, `0c42…`, `S-0c42…`, sysfs's `0c42:a103:00a1:b2c1`); anything else verbatim."""
    raw = text.strip()
    bare = raw[2:] if raw[:2] in ("S-", "H-", "R-") else raw
    bare = bare[2:] if bare[:2].lower() == "0x" else bare
    if re.fullmatch(r"[0-9A-Fa-f]{4}(:[0-9A-Fa-f]{4}){3}", bare):
        bare = bare.replace(":", "")
    if re.fullmatch(r"[0-9A-Fa-f]{1,16}", bare):
        return f"0x{int(bare, 16):016x}"
    return raw


@dataclass(frozen=True)
class FabricDump:
    """One fabric as ibnetdiscover saw it."""

    switches: Mapping[str, str]  # switch node GUID -> its NodeDescription
    links: Mapping[str, frozenset[str]]  # switch -> the switches it is cabled to
    ca_ports: Mapping[str, tuple[str, int]]  # CA port GUID -> (switch GUID, switch port)
    ca_names: Mapping[str, str] = field(default_factory=dict)  # CA port GUID -> NodeDescription

    def levels(self) -> dict[str, int]:
        """Switch -> its tier: 1 for a switch with a CA cabled to it (a leaf), n+1 for one
        cabled to a tier-n switch and to none lower. A switch no host reaches is absent."""
        level = {sw: 1 for sw, _ in self.ca_ports.values() if sw in self.switches}
        frontier = sorted(level)
        while frontier:
            nxt = []
            for sw in frontier:
                for peer in sorted(self.links.get(sw, ())):
                    if peer not in level:
                        level[peer] = level[sw] + 1
                        nxt.append(peer)
            frontier = nxt
        return level


def parse_ibnetdiscover(text: str, *, source: str = "ibnetdiscover") -> FabricDump:
    """Read ibnetdiscover's default output (see above). Raises FabricDumpError naming the
    line that is neither a node header, a port line, nor one of the tool's other lines."""
    switches: dict[str, str] = {}
    links: dict[str, set[str]] = defaultdict(set)
    ca_ports: dict[str, tuple[str, int]] = {}
    ca_names: dict[str, str] = {}
    current: tuple[str, str, str] | None = None  # (kind, guid, description)
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or _SKIP.match(line):
            continue
        header = _HEADER.match(line)
        if header:
            kind, _, _, node, desc = header.groups()
            current = (kind, guid(node), desc or "")
            if kind == "Switch":
                switches[current[1]] = current[2]
            continue
        port = _PORT.match(line)
        if not port:
            raise FabricDumpError(f"{source} line {number}: cannot read {line[:80]!r}")
        if current is None:
            raise FabricDumpError(f"{source} line {number}: a port line before any node")
        local, local_guid, peer_kind, peer, peer_port, peer_guid, peer_desc = port.groups()
        kind, node, desc = current
        peer = guid(peer)
        if kind == "Switch" and peer_kind == "S":
            links[node].add(peer)
            links[peer].add(node)
        elif kind == "Switch" and peer_kind == "H":
            if not peer_guid:
                raise FabricDumpError(f"{source} line {number}: a CA peer without its port GUID")
            ca_ports[guid(peer_guid)] = (node, int(local))
            ca_names.setdefault(guid(peer_guid), peer_desc or "")
        elif kind in ("Ca", "Rt") and peer_kind == "S":
            if not local_guid:
                raise FabricDumpError(f"{source} line {number}: a CA port without its GUID")
            ca_ports[guid(local_guid)] = (peer, int(peer_port))
            ca_names.setdefault(guid(local_guid), desc)
    if not switches and not ca_ports:
        raise FabricDumpError(f"{source}: no Switch or Ca block (not an ibnetdiscover dump?)")
    return FabricDump(
        switches=switches,
        links={sw: frozenset(peers) for sw, peers in links.items()},
        ca_ports=ca_ports,
        ca_names=ca_names,
    )


# --- the nodes' NICs, from their NodeDevices records ------------------------------------------


@dataclass(frozen=True)
class Nic:
    """One RDMA physical function's scale-out facts, as the node agent published them."""

    name: str
    rdma: str | None = None
    port_guid: str | None = None
    switch: str | None = None  # the neighbour switch id (measured, else declared)
    switch_name: str | None = None  # its IB NodeDescription or LLDP system name
    rail: int | None = None
    role: str | None = None
    disagreement: str | None = None


def nics_of(node_devices: Mapping[str, Any] | None) -> tuple[Nic, ...]:
    """The RDMA NICs of one NodeDevices object (JSON), those the agent gave a scaleOut."""
    out = []
    for iface in ((node_devices or {}).get("spec") or {}).get("interfaces") or []:
        so = iface.get("scaleOut")
        if not iface.get("rdma") or not isinstance(so, dict):
            continue
        nb = so.get("neighbour") or {}
        out.append(
            Nic(
                name=str(iface.get("name") or ""),
                rdma=iface.get("rdmaDevice"),
                port_guid=guid(so["portGuid"]) if so.get("portGuid") else None,
                switch=guid(str(nb["switch"])) if nb.get("switch") else None,
                switch_name=nb.get("name"),
                rail=so.get("rail"),
                role=so.get("role"),
                disagreement=so.get("disagreement"),
            )
        )
    return tuple(out)


# --- the tree and the cabling check ------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One node's place in the tree, or why it has none."""

    node: str
    tiers: tuple[str, ...] = ()  # label values, nearest first (at most 3)
    failures: tuple[str, ...] = ()  # the cabling check's findings; non-empty: no tiers
    block: tuple[str, ...] = ()  # the leaves of its block (tier-1's switches)
    checked: bool = False  # a rail-optimised block: the per-rail check ran

    @property
    def passed(self) -> bool:
        return not self.failures


def group_name(switches: Iterable[str]) -> str:
    """A set of switches as one label value (stable: sorted ids, hashed beyond 63)."""
    return label_value("+".join(sorted(set(switches))))


def _compute_nics(nics: Sequence[Nic]) -> list[Nic]:
    """The NICs that carry the node's east-west traffic: those with role compute, or every NIC
    when the agent gave none a role (roles unknown: nothing is excluded on a guess)."""
    if any(n.role is not None for n in nics):
        return [n for n in nics if n.role == "compute"]
    return list(nics)


class _Unions:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def build_tree(
    nodes: Mapping[str, Sequence[Nic]],
    dumps: Sequence[FabricDump] = (),
    declared: DeclaredTopology | None = None,
) -> dict[str, Verdict]:
    """Every node's tiers and the cabling check's findings (see the module docstring).

    Blocks: two leaves are one block when at least two nodes have compute NICs on both (or,
    where fewer nodes reach a leaf at all, every one of them does): a single mis-cabled node
    cannot merge two scalable units into one. Within a block of several leaves (rail-optimised),
    a node fails when two of its compute NICs reach one leaf, when a NIC of rail r reaches
    another leaf than the one most of the block's nodes reach on rail r, or when a storage or
    frontend NIC reaches one of the block's leaves. A node whose compute NICs reach leaves of
    several blocks fails in any block; so does a NIC whose declared and measured neighbours
    disagree. A failed node gets no tiers: it claims no closeness until fixed.
    """
    declared = declared or DeclaredTopology()
    leaves, others = _leaves(nodes, dumps, declared)
    unions, blocks = _blocks(leaves)
    rail_of = {(node, n.name): n.rail for node, nics in nodes.items() for n in nics}
    rails = _rails(leaves, unions, rail_of)
    aliases = _aliases(nodes)
    levels = [d.levels() for d in dumps]
    above_block: dict[frozenset[str], tuple[str, ...]] = {}  # a block's tiers, computed once
    verdicts: dict[str, Verdict] = {}
    for node in sorted(nodes):
        per_nic = leaves[node]
        failures = [
            f"{each.name}: topology file and measurement disagree: {each.disagreement}"
            for each in nodes[node]
            if each.disagreement
        ]
        if not per_nic:
            verdicts[node] = Verdict(node, failures=tuple(failures))
            continue
        home_counts = Counter(unions.find(leaf) for leaf in per_nic.values())
        # The block most of its NICs reach (ties: the smaller name, so the verdict is stable).
        home = min(home_counts, key=lambda b: (-home_counts[b], b))
        block = blocks[home]
        rail_optimised = len(block) > 1
        for nic, leaf in sorted(per_nic.items()):
            if unions.find(leaf) != home:
                other = group_name(blocks[unions.find(leaf)])
                failures.append(
                    f"{nic} reaches leaf {leaf}, of another block ({other}) "
                    f"than the node's other NICs ({group_name(block)})"
                )
        if rail_optimised:
            failures += _rail_failures(
                node, nodes[node], per_nic, others[node], home, block, unions, rails, rail_of
            )
        if failures:
            verdicts[node] = Verdict(
                node, failures=tuple(failures), block=tuple(sorted(block)), checked=rail_optimised
            )
            continue
        key = frozenset(block)
        if key not in above_block:
            above_block[key] = _tiers(block, dumps, levels, declared, aliases)
        verdicts[node] = Verdict(
            node,
            tiers=above_block[key],
            block=tuple(sorted(block)),
            checked=rail_optimised,
        )
    return verdicts


def _leaves(
    nodes: Mapping[str, Sequence[Nic]], dumps: Sequence[FabricDump], declared: DeclaredTopology
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """Each node's compute NICs' leaves (node -> NIC -> leaf) and its storage and frontend
    NICs' (the same shape): measured, else from a fabric dump, else the file's node leaf."""
    by_port: dict[str, str] = {}
    for dump in dumps:
        by_port.update({port: sw for port, (sw, _) in dump.ca_ports.items()})

    def leaf_of(nic: Nic) -> str | None:
        if nic.switch:
            return nic.switch
        if nic.port_guid and nic.port_guid in by_port:
            return by_port[nic.port_guid]
        return None

    leaves: dict[str, dict[str, str]] = {}  # node -> compute NIC -> leaf
    others: dict[str, dict[str, str]] = {}  # node -> storage/frontend NIC -> leaf
    for node, nics in nodes.items():
        compute = _compute_nics(nics)
        leaves[node] = {n.name: leaf for n in compute if (leaf := leaf_of(n))}
        others[node] = {
            n.name: leaf for n in nics if n not in compute and (leaf := leaf_of(n)) is not None
        }
        if not leaves[node] and node in declared.node_switch:
            # Nothing measured or declared per NIC: the file's leaf for the node (trusted).
            leaves[node] = {"": declared.node_switch[node]}
    return leaves, others


def _aliases(nodes: Mapping[str, Sequence[Nic]]) -> dict[str, str]:
    """A switch's other name (LLDP system name, IB NodeDescription): the topology file may
    use it."""
    return {
        n.switch: n.switch_name
        for nics in nodes.values()
        for n in nics
        if n.switch and n.switch_name
    }


def _blocks(leaves: Mapping[str, Mapping[str, str]]) -> tuple[_Unions, dict[str, set[str]]]:
    """The leaves joined into blocks (see build_tree), and each block's leaves by its root."""
    on_leaf: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    for per_nic in leaves.values():
        distinct = sorted(set(per_nic.values()))
        on_leaf.update(distinct)
        pairs.update((a, b) for i, a in enumerate(distinct) for b in distinct[i + 1 :])
    unions = _Unions()
    for leaf in on_leaf:
        unions.find(leaf)
    for (a, b), count in pairs.items():
        if count >= min(2, on_leaf[a], on_leaf[b]):
            unions.join(a, b)
    blocks: dict[str, set[str]] = defaultdict(set)
    for leaf in on_leaf:
        blocks[unions.find(leaf)].add(leaf)
    return unions, blocks


def _rails(
    leaves: Mapping[str, Mapping[str, str]],
    unions: _Unions,
    rail_of: Mapping[tuple[str, str], int | None],
) -> dict[tuple[str, int], Counter[str]]:
    """How many NICs of each rail of each block reach each leaf (the rail's leaf: the most)."""
    rails: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    for node, per_nic in leaves.items():
        for nic, leaf in per_nic.items():
            rail = rail_of.get((node, nic))
            if rail is not None:
                rails[(unions.find(leaf), rail)][leaf] += 1
    return rails


def _rail_failures(
    node: str,
    nics: Sequence[Nic],
    per_nic: Mapping[str, str],
    others: Mapping[str, str],
    home: str,
    block: set[str],
    unions: _Unions,
    rails: Mapping[tuple[str, int], Counter[str]],
    rail_of: Mapping[tuple[str, str], int | None],
) -> list[str]:
    """A node's cabling faults within its rail-optimised block: two compute NICs on one
    leaf, a NIC off its rail's leaf, a storage or frontend NIC on a compute leaf."""
    failures: list[str] = []
    by_leaf: dict[str, list[str]] = defaultdict(list)
    for nic, leaf in per_nic.items():
        if unions.find(leaf) == home:
            by_leaf[leaf].append(nic)
    for leaf, names in sorted(by_leaf.items()):
        if len(names) > 1:
            failures.append(
                f"{' and '.join(sorted(names))} all reach leaf {leaf}: a rail-optimised "
                "block wants one compute NIC per leaf"
            )
    for nic, leaf in sorted(per_nic.items()):
        rail = rail_of.get((node, nic))
        seen = rails.get((home, rail)) if rail is not None else None
        if not seen or unions.find(leaf) != home:
            continue
        want, count = min(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        if leaf != want and count > seen[leaf]:
            failures.append(
                f"{nic} (rail {rail}) reaches leaf {leaf}; rail {rail} of this block is "
                f"leaf {want} ({count} of {sum(seen.values())} NICs)"
            )
    for nic, leaf in sorted(others.items()):
        if leaf in block:
            role = next((n.role for n in nics if n.name == nic), None)
            failures.append(
                f"{nic} ({role or 'not compute'}) reaches compute leaf {leaf} of a "
                "rail-optimised block"
            )
    return failures


def _tiers(
    block: set[str],
    dumps: Sequence[FabricDump],
    levels: Sequence[Mapping[str, int]],
    declared: DeclaredTopology,
    aliases: Mapping[str, str],
) -> tuple[str, ...]:
    """tier-1 (the block) and the sets above it, as far as the dumps or the file know."""
    tiers = [group_name(block)]
    current = set(block)
    while len(tiers) < 3:
        above: set[str] = set()
        for sw in current:
            found = False
            for dump, level in zip(dumps, levels, strict=True):
                if sw in level:
                    found = True
                    above |= {p for p in dump.links.get(sw, ()) if level.get(p) == level[sw] + 1}
            parent = declared.parents.get(sw) or declared.parents.get(aliases.get(sw, ""))
            if not found and parent:
                above.add(parent)
        if not above:
            break
        tiers.append(group_name(above))
        current = above
    return tuple(tiers)
