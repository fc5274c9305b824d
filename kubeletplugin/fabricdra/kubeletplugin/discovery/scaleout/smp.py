"""The InfiniBand neighbour of an HCA port, by a directed-route SMP query of the peer.

Tool: infiniband-diags' `smpquery` (rdma-core), not our own umad client. Talking to
/dev/infiniband/umadN directly means registering a management agent, building 256-byte SMPs
with directed-route headers and decoding the attribute layouts of the IBA spec in Python: a
second implementation of libibmad to keep correct, for three fields. `smpquery` is the tool
every IB operator already trusts for exactly this query; the node image ships it
(deployments/container/Containerfile, package `infiniband-diags`) and a missing or failing
binary is reported per NIC as an error, never as "no neighbour".

The queries, for port P of CA `mlx5_0` (DR path `0,P`: leave the local port, stop at the peer):

    smpquery -C mlx5_0 -P P -D nodeinfo 0,P
    smpquery -C mlx5_0 -P P -D nodedesc 0,P

Their output format (rdma-core infiniband-diags/smpquery.c and libibmad/dump.c,
https://github.com/linux-rdma/rdma-core/blob/master/infiniband-diags/smpquery.c):

    # Node info: DR path slid 65535; dlid 65535; 0,1
    BaseVers:........................1
    NodeType:........................Switch
    NumPorts:........................65
    Guid:............................0x0c42a10300a1b2c0
    LocalPort:.......................17

    Node Description:................MF0;leaf-r0-su1:MQM9700/U1

Every NodeInfo line is `Name:` then dots to a fixed column then the value. The NodeDescription
line pads the name with dots to 32 characters, or one dot when it is 32 or longer. The peer's
NodeInfo.LocalPortNum is the port the SMP entered it by: the switch port our cable lands on.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fabricdra.api.inventory import Neighbour

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9 _/-]*?):\.+(.*)$")
_DESC = "Node Description:"


class SmpError(ValueError):
    """The tool's output was not what smpquery prints; the message says what was missing."""


@dataclass(frozen=True, slots=True)
class Peer:
    node_type: str
    guid: str
    local_port: int
    description: str | None = None


def parse_nodeinfo(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _FIELD.match(line.strip())
        if match:
            fields[match.group(1)] = match.group(2).strip()
    return fields


def parse_nodedesc(text: str) -> str:
    for line in text.splitlines():
        if line.startswith(_DESC):
            rest = line[len(_DESC) :]
            # smpquery pads to 32 characters, or writes one dot when the name is longer.
            return rest.lstrip(".") if len(rest) <= 32 else rest[1:]
    raise SmpError(f"no {_DESC!r} line in smpquery output")


def parse_peer(nodeinfo: str, nodedesc: str | None) -> Peer:
    fields = parse_nodeinfo(nodeinfo)
    missing = [k for k in ("NodeType", "Guid", "LocalPort") if k not in fields]
    if missing:
        raise SmpError(f"smpquery nodeinfo output lacks {', '.join(missing)}")
    guid = fields["Guid"].lower()
    if not re.match(r"^0x[0-9a-f]{1,16}$", guid):
        raise SmpError(f"smpquery nodeinfo: Guid {fields['Guid']!r} is not a GUID")
    try:
        port = int(fields["LocalPort"], 0)
    except ValueError:
        raise SmpError(f"smpquery nodeinfo: LocalPort {fields['LocalPort']!r}") from None
    guid = "0x" + guid[2:].rjust(16, "0")
    desc = parse_nodedesc(nodedesc) if nodedesc is not None else None
    return Peer(node_type=fields["NodeType"], guid=guid, local_port=port, description=desc)


def neighbour_of(peer: Peer) -> Neighbour | None:
    """The measured neighbour switch; None where the peer is not a switch (a back-to-back
    cable to another HCA: a measured fact, and there is no switch to name)."""
    if peer.node_type != "Switch":
        return None
    return Neighbour(
        switch=peer.guid,
        port=str(peer.local_port),
        name=peer.description or None,
        source="measured",
        via="smp",
    )


Runner = Callable[[Sequence[str]], str]


def run_tool(argv: Sequence[str], timeout: float = 5.0) -> str:
    """Run one infiniband-diags command; its stderr (or the OS error) becomes the message."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SmpError(f"{argv[0]} not found (install infiniband-diags)") from None
    except subprocess.TimeoutExpired:
        raise SmpError(f"{' '.join(argv)} timed out after {timeout:g}s") from None
    except OSError as e:
        raise SmpError(f"{argv[0]}: {e.strerror or e}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise SmpError(f"{' '.join(argv)} exited {done.returncode}: {why[-1] if why else ''}")
    return done.stdout


def query_peer(ca: str, port: int, run: Runner = run_tool, tool: str = "smpquery") -> Peer:
    path = f"0,{port}"
    base = [tool, "-C", ca, "-P", str(port), "-D"]
    info = run([*base, "nodeinfo", path])
    desc = run([*base, "nodedesc", path])
    return parse_peer(info, desc)
