"""`fabricdra imex-daemon`: one per node of a managed ComputeDomain (the controller's
DaemonSet). Each pass reads the domain, takes the peers of this node's fabric domain from
`status.nodes` (the controller assigns the indices: this daemon never writes the domain),
lets the supervisor write IMEX's config and (re)start it, and reports the outcome in its own
Lease (report.py), only when it changed. Stopping deletes the report and stops IMEX."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from fabricdra.api.rest import COMPUTE_DOMAINS, ApiError, Rest

from .imex import ImexSupervisor, State
from .report import delete_report, write_report

log = logging.getLogger("fabricdra.imex-daemon")


@dataclass(frozen=True)
class DaemonIdentity:
    node: str
    pod_ip: str
    domain_namespace: str
    domain_name: str
    domain_uid: str
    report_namespace: str


def peers_of(domain: dict[str, Any], node: str) -> list[str]:
    """IPs of the domain's nodes in this node's fabric domain, by index; [] until the
    controller has listed this node (with an IP)."""
    rows = sorted(domain.get("status", {}).get("nodes", []) or [], key=lambda r: r["index"])
    mine = next((r for r in rows if r["name"] == node), None)
    if mine is None or not mine.get("ipAddress"):
        return []
    fabric = mine.get("fabricDomain", "")
    return [
        r["ipAddress"] for r in rows if r.get("fabricDomain", "") == fabric and r.get("ipAddress")
    ]


class ImexDaemon:
    def __init__(self, rest: Rest, who: DaemonIdentity, supervisor: ImexSupervisor) -> None:
        self.rest, self.who, self.supervisor = rest, who, supervisor
        self.last: State | None = None

    def run_once(self) -> State:
        who = self.who
        try:
            domain = self.rest.get(COMPUTE_DOMAINS, who.domain_name, who.domain_namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            domain = None
        if domain is None or domain["metadata"].get("uid") != who.domain_uid:
            self.supervisor.stop()
            state = State(False, "the ComputeDomain is gone")
        else:
            state = self.supervisor.step(peers_of(domain, who.node))
        if state != self.last:
            write_report(
                self.rest,
                who.report_namespace,
                who.domain_uid,
                who.node,
                ready=state.ready,
                message=state.message,
                ip=who.pod_ip,
            )
            log.info("IMEX state: %s (%s)", "ready" if state.ready else "not ready", state.message)
            self.last = state
        return state

    def run(self, stop: threading.Event, interval: float = 2.0) -> None:
        try:
            while not stop.is_set():
                try:
                    self.run_once()
                except ApiError as e:
                    log.warning("API: %s", e)
                stop.wait(interval)
        finally:
            self.supervisor.stop()
            try:
                delete_report(
                    self.rest, self.who.report_namespace, self.who.domain_uid, self.who.node
                )
            except ApiError as e:
                log.warning("deleting the report: %s", e)
