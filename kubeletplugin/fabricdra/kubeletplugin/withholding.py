"""Devices another advertiser hands out on this node, withheld from a pass (coexistence.py
has the rules): the agent's state for it, and the report of a change (a log line, a
`DevicesWithheld` Warning event on the Node) once the pass has published."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from .apifacts import ApiFacts, Facts
from .coexistence import (
    GROUPS,
    Conflict,
    Group,
    NetnsMode,
    netns_conflicts,
    read_netns_mode,
    withhold,
)
from .devices import DeviceInventory
from .discovery.sysfs import SysfsTree

log = structlog.get_logger("fabricdra.agent")


class Withholding:
    def __init__(self, facts: ApiFacts) -> None:
        self.facts = facts
        # The RDMA namespace mode of the last readable reading (the device plugins on the
        # Node's capacity are API facts, apifacts.py), this pass's conflicts and withheld
        # devices, and the withheld set a report was last made for.
        self._netns_mode: NetnsMode | None = None
        self._netns_known = False
        self._withheld_report: (
            tuple[Mapping[str, Any] | None, list[Conflict], dict[Group, list[str]]] | None
        ) = None
        self._reported_withheld: tuple[str, ...] = ()
        self.withheld: dict[str, list[str]] = {}  # group -> device names, this pass

    def netns(self, tree: SysfsTree) -> list[Conflict]:
        """The groups the RDMA subsystem's namespace mode withholds (coexistence.py), read from
        this pass's sysfs; unreadable: the last reading; never readable: RDMA and EFA."""
        try:
            self._netns_mode, self._netns_known = read_netns_mode(tree), True
        except ValueError as e:
            log.warning("RDMA namespace mode unreadable; last reading kept", error=str(e))
        if not self._netns_known:
            return [Conflict(g, "the RDMA namespace mode is unreadable") for g in ("rdma", "efa")]
        return netns_conflicts(self._netns_mode)

    def apply(
        self, inventory: DeviceInventory, facts: Facts, netns: list[Conflict]
    ) -> DeviceInventory:
        """This pass's inventory without the devices another advertiser hands out here: a
        device plugin on the Node's capacity (as last read, apifacts.py), or an RDMA
        subsystem in exclusive namespace mode (`netns`). The Node never read: the groups it
        decides are withheld (unknown is not "no device plugin"). The report of a change (a
        log line, an event on the Node) waits until the pass has published
        (`report`)."""
        plugins = facts.plugins
        if plugins is None:
            plugins = tuple(Conflict(g, "the Node could not be read yet") for g in GROUPS)
        conflicts = [*plugins, *netns]
        kept, dropped = withhold(inventory, conflicts)
        self.withheld = dict(dropped.items())
        self._withheld_report = (facts.node, conflicts, dropped)
        return kept

    def report(self) -> None:
        """A log line and a Warning event on the Node each time the withheld set changes: after
        the pass has told kubelet and published, so an API write never delays either."""
        if self._withheld_report is None:
            return
        node, conflicts, dropped = self._withheld_report
        reasons = {g: [c.reason for c in conflicts if c.group == g] for g in dropped}
        key = tuple(f"{g}={len(dropped[g])}:{';'.join(reasons[g])}" for g in sorted(dropped))
        if key == self._reported_withheld:
            return
        if not dropped:
            log.info("no device withheld: no other advertiser on this node")
            self._reported_withheld = key
            return
        for group in sorted(dropped):
            log.warning(
                "devices withheld: another advertiser hands them out on this node",
                group=group,
                devices=len(dropped[group]),
                because=reasons[group],
            )
        message = "; ".join(
            f"{len(dropped[g])} {g} device(s) not offered by devices.fabricdra.io: "
            + ", ".join(reasons[g])
            for g in sorted(dropped)
        )
        message += " (docs/coexistence.md)"
        if node is None or self.facts.event(node, "DevicesWithheld", message[:1024]):
            self._reported_withheld = key
