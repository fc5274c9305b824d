"""`fabricdra imex-daemon`: one per node of a managed ComputeDomain (the controller's
DaemonSet). It watches its domain (one LIST+WATCH with a field selector on the name, no
polling: at 1,000 nodes a GET every 2 s per daemon was ~500 quorum reads/s); each pass takes
the peers of this node's fabric domain from
`status.nodes` (the controller assigns the indices: this daemon never writes the domain),
lets the supervisor write IMEX's config and (re)start it, and reports the outcome in its own
Lease (report.py), only when it changed. Stopping deletes the report and stops IMEX."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricdra.kube.informer import Informer
from fabricdra.kube.rest import COMPUTE_DOMAINS, ApiError, NotFound, Rest

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


# On a node without a multi-node NVLink fabric nothing is imported across nodes, so IMEX has
# nothing to do (NVIDIA's daemon skips IMEX when the node's clique id is empty): the daemon
# reports ready without it, so such a domain is Ready on hosts with no IMEX binary at all.
NO_FABRIC = (
    "no NVLink fabric on this node: IMEX is not run (nothing is imported across nodes); "
    "the domain's IMEX channel still isolates its workloads"
)


def own_row(domain: dict[str, Any], node: str) -> dict[str, Any] | None:
    rows = domain.get("status", {}).get("nodes", []) or []
    return next((r for r in rows if r["name"] == node), None)


def peers_of(domain: dict[str, Any], node: str) -> dict[int, str]:
    """IPs of the domain's nodes in this node's fabric domain, by their index (the stable
    slot the controller gave each node); with segmentSize, of this node's segment only (each
    segment is its own IMEX domain); {} until the controller has listed this node (with
    an IP)."""
    rows = domain.get("status", {}).get("nodes", []) or []
    mine = next((r for r in rows if r["name"] == node), None)
    if mine is None or not mine.get("ipAddress"):
        return {}
    fabric, segment = mine.get("fabricDomain", ""), mine.get("segment")
    return {
        int(r["index"]): r["ipAddress"]
        for r in rows
        if r.get("fabricDomain", "") == fabric
        and r.get("segment") == segment
        and r.get("ipAddress")
    }


# The report's heartbeat: renewed every third of its duration, so two renewals may fail
# before the controller marks this node's row silent (a kubelet's node Lease: 40 s / 10 s).
REPORT_LEASE_SECONDS = 40
READY_FILE = "ready"  # in the config dir while IMEX answers READY (the readiness probe)
# In the config dir, touched at every turn of the daemon's loop: its age is the startup and
# liveness probes' answer (a daemon stuck in a call is restarted; a hung IMEX is restarted by
# its supervisor, imex.py).
ALIVE_FILE = "alive"


class ImexDaemon:
    def __init__(
        self,
        rest: Rest,
        who: DaemonIdentity,
        supervisor: ImexSupervisor,
        *,
        lease_seconds: int = REPORT_LEASE_SECONDS,
    ) -> None:
        self.rest, self.who, self.supervisor = rest, who, supervisor
        self.last: State | None = None
        self.lease_seconds = lease_seconds
        self._renewed_at = 0.0  # time.monotonic() of the last report write

    def run_once(self) -> State:
        """One pass with a fresh read of the domain (one GET; `run` watches instead)."""
        who = self.who
        try:
            domain = self.rest.get(COMPUTE_DOMAINS, who.domain_name, who.domain_namespace)
        except NotFound:
            domain = None
        return self.step(domain)

    def step(self, domain: dict[str, Any] | None) -> State:
        """One pass with the domain as last seen (None: it does not exist)."""
        who = self.who
        if domain is None or domain["metadata"].get("uid") != who.domain_uid:
            self.supervisor.stop()
            state = State(False, "the ComputeDomain is gone")
        elif (row := own_row(domain, who.node)) is not None and not row.get("fabricDomain"):
            self.supervisor.stop()  # the node's row says no fabric (it may have lost its label)
            state = State(True, NO_FABRIC)
        else:
            state = self.supervisor.step(peers_of(domain, who.node))
        self._mark_ready(state.ready)
        heartbeat_due = time.monotonic() - self._renewed_at >= self.lease_seconds / 3
        if state != self.last or heartbeat_due:
            write_report(
                self.rest,
                who.report_namespace,
                who.domain_uid,
                who.node,
                ready=state.ready,
                message=state.message,
                ip=who.pod_ip,
                lease_seconds=self.lease_seconds,
                renew=heartbeat_due,
            )
            self._renewed_at = time.monotonic()
            if state != self.last:
                log.info(
                    "IMEX state: %s (%s)", "ready" if state.ready else "not ready", state.message
                )
            self.last = state
        return state

    def _mark_ready(self, ready: bool) -> None:
        """The readiness probe's answer: a file, so kubelet's probe is `test -e`, not a
        Python start-up (0.55 s CPU and 54 MB per probe under the pod's limits)."""
        path = self.supervisor.settings.config_dir / READY_FILE
        if ready:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("READY\n")
        else:
            path.unlink(missing_ok=True)

    @staticmethod
    def _beat(path: Path) -> None:
        """The liveness heartbeat: the file's modification time (also while the API server
        is out of reach: the loop turns, and restarting the pod would not bring it back)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def run(self, stop: threading.Event, interval: float = 2.0) -> None:
        """Watch the domain; pass again at once when it changes, and every `interval` seconds
        to look after IMEX (which costs no API read)."""
        who = self.who
        watch = Informer(
            self.rest,
            COMPUTE_DOMAINS,
            namespace=who.domain_namespace,
            field_selector=f"metadata.name={who.domain_name}",
        )
        self._mark_ready(False)  # the folder outlives pods: a new pod starts not ready
        alive = self.supervisor.settings.config_dir / ALIVE_FILE
        alive.unlink(missing_ok=True)  # nor alive: the startup probe waits for this loop
        changed = threading.Event()
        watch.on_event(lambda *_: changed.set())
        watch.start()
        try:
            while not stop.is_set():
                self._beat(alive)
                if watch.has_synced():  # before the first LIST, "not there" is not known
                    changed.clear()
                    try:
                        self.step(watch.get(f"{who.domain_namespace}/{who.domain_name}"))
                    except ApiError as e:
                        log.warning("API: %s", e)
                changed.wait(interval)
        finally:
            watch.stop()
            self.supervisor.stop()
            self._mark_ready(False)
            try:
                delete_report(
                    self.rest, self.who.report_namespace, self.who.domain_uid, self.who.node
                )
            except ApiError as e:
                log.warning("deleting the report: %s", e)
