"""The node agent's scale-out readers (the I/O behind discovery/scaleout): which neighbour
source answers for which NIC, and the topology file.

    InfiniBand port  `smpquery` over the directed route 0,<port> (`--ib-neighbours smpquery`,
                     the default; `off`: not asked)
    Ethernet port    `--lldp raw` (the default): one AF_PACKET listener per RoCE netdev, kept
                     across passes (a switch sends every 30 s by default, so a pass cannot wait
                     for a frame); `--lldp lldpd`: the host's lldpd, one `lldpcli` per pass;
                     `--lldp off`: not asked. Never both: the flag picks one.

The topology file (`--topology-file`) is read once per pass: a file that does not parse is an
error the agent logs and reports, and no declared fact is used from it (never a half-read file).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fabricdra.api.inventory import Interface, Neighbour
from fabricdra.api.scaleout import DeclaredTopology, TopologyFileError, parse_topology_file

from .discovery.scaleout import lldpd, smp
from .discovery.scaleout.annotate import RoleOverride, ScaleOutInputs
from .discovery.scaleout.lldp import LldpListener

LldpMode = Literal["raw", "lldpd", "off"]
IbMode = Literal["smpquery", "off"]
LLDP_MODES: tuple[LldpMode, ...] = ("raw", "lldpd", "off")
IB_MODES: tuple[IbMode, ...] = ("smpquery", "off")


@dataclass(frozen=True)
class ScaleOutConfig:
    lldp: LldpMode = "raw"
    ib: IbMode = "smpquery"
    topology_file: Path | None = None
    roles: tuple[RoleOverride, ...] = ()


class NeighbourSources:
    """Answers `NeighbourSource` for one discovery pass; `begin_pass` refreshes lldpd's list."""

    def __init__(
        self,
        config: ScaleOutConfig,
        *,
        smp_runner: smp.Runner = smp.run_tool,
        lldpcli: Callable[[], str] = lldpd.run_lldpcli,
    ) -> None:
        self.config = config
        self._smp = smp_runner
        self._lldpcli = lldpcli
        self._listeners: dict[str, LldpListener] = {}
        self._lldpd: Mapping[str, Neighbour] | str = {}
        self._lock = threading.Lock()

    def begin_pass(self) -> None:
        if self.config.lldp != "lldpd":
            return
        try:
            self._lldpd = lldpd.parse_neighbors(self._lldpcli())
        except lldpd.LldpdError as e:
            self._lldpd = str(e)

    def __call__(self, iface: Interface, port: int | None) -> Neighbour | str | None:
        layer = (iface.linkLayer or "").lower()
        if layer == "infiniband":
            return self._ib(iface, port)
        if layer == "ethernet":
            return self._ethernet(iface)
        return None

    def _ib(self, iface: Interface, port: int | None) -> Neighbour | str | None:
        if self.config.ib == "off" or not iface.rdmaDevice:
            return None
        if port is None:
            return f"no SMP query: which port of {iface.rdmaDevice} is {iface.name} is unknown"
        try:
            peer = smp.query_peer(iface.rdmaDevice, port, self._smp)
        except smp.SmpError as e:
            return f"SMP query of {iface.rdmaDevice} port {port}'s peer failed: {e}"
        found = smp.neighbour_of(peer)
        if found is None:
            return None  # cabled to another HCA: there is no switch to name
        return found

    def _ethernet(self, iface: Interface) -> Neighbour | str | None:
        if self.config.lldp == "off":
            return None
        if self.config.lldp == "lldpd":
            return lldpd.reading_for(self._lldpd, iface.name)
        with self._lock:
            listener = self._listeners.get(iface.name)
            if listener is None:
                listener = self._listeners[iface.name] = LldpListener(iface.name)
        return listener.reading()

    def close(self) -> None:
        with self._lock:
            listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            listener.close()


def read_topology(path: Path | None) -> tuple[DeclaredTopology | None, str | None]:
    """(the declared topology, None) or (None, why it could not be used)."""
    if path is None:
        return None, None
    try:
        return parse_topology_file(path.read_text()), None
    except OSError as e:
        return None, f"topology file {path}: {e.strerror or e}"
    except TopologyFileError as e:
        return None, f"topology file {path}: {e}"


def inputs_for(
    node: str, config: ScaleOutConfig, sources: NeighbourSources | None
) -> tuple[ScaleOutInputs, str | None]:
    declared, problem = read_topology(config.topology_file)
    return ScaleOutInputs(node, declared, sources, config.roles), problem
