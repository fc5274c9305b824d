"""The multi-node NVLink check of each fabric domain (issue 18 point 4), which decides when a
fabric domain's nodes may be offered to ComputeDomains under `--fabric-check`.

The per-node probes see one tray's GPUs and links only; the NVLink trunk *between* trays is
crossed by every ComputeDomain of two nodes or more. So per fabric domain the controller runs
NVIDIA's multi-node nvbandwidth across the domain's idle, verified nodes (fabriccheckrun.py)
and labels each node the check passed with `fabricdra.io/fabric-verified=true`, the label
gang placement requires (capacity.fabric_unchecked).

When: a node of the domain that can take a pod, is idle (no ComputeDomain holds it and no claim
holds a GPU of its: the check's workers are privileged with every GPU, and never share a tray
with a job, single-node ones included) and passed its per-node gate (a *member*) is *covered*
when it carries the label and its record (`fabricdra.io/fabric-check`, api/fabriccheck.py) says
a check passed with it in this domain on the hardware it has now (its NodeDevices
`currentFingerprint`). A domain with an uncovered member is checked, over all its members (so a
tray added or repaired is measured against the others); one whose members are all covered is
left alone: a node that went busy and idle again, or a restarted controller, runs nothing. The
membership fingerprint (every member and its hardware fingerprint) is recorded with the result.

Outcome: passed -> every checked node labelled, with its record; failed -> the label removed
from the nodes the check measured (only those: a tray a running domain holds was not in it), a
record on each of them, and a Warning Event naming the GPU pair, its figure and the floor; not
run (no verification image, a launch that failed) -> nothing changes but a Warning Event. A
failed or not-run check is tried again after 60 s, then 120 s, ... up to an hour (as the per-
node verification retries), at once when a node joins or its hardware changes (a subset of the
nodes, some of them busy, waits out the backoff). A domain with a single node has no trunk to
check: that node is labelled with the reason "one node, no trunk to check" (a ComputeDomain of
one never crosses the trunk). A domain whose GPU classes have no GPU-to-GPU figure
(`gpuBandwidthGBs`, verification.json) holds nothing: its members are labelled, saying so. With
two nodes or more but one member only, the check waits for a second idle verified node to
measure against.

The decisions (`members`, `plan`, `outcome`) are pure; `FabricCheck` reads the caches, runs
the check (a Runner) and writes. Leader-only: it runs in a worker the controller starts once
leading and synced, and `require_synced` fails a reconcile before any cache is synced.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol

from fabricdra.api import labels
from fabricdra.api.fabriccheck import FabricCheckRecord, MeasuredLoss, dump, record_of
from fabricdra.api.jsontypes import JSON
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.api.verification import load_expectations

from . import capacity, fabricloss
from .indexes import BY_FABRIC, BY_NODE
from .status import Event

if TYPE_CHECKING:
    from .deps import FabricCheckDeps

log = logging.getLogger("fabricdra.controller")

Outcome = Literal["Passed", "Failed", "NotRun"]

ONE_NODE = "one node, no trunk to check: a ComputeDomain of one never crosses it"
RETRY_FIRST, RETRY_MAX = 60.0, 3600.0  # as the per-node verification's retries


@dataclass(frozen=True)
class CheckResult:
    """What one run of the check found."""

    outcome: Outcome
    reason: str
    min_gbs: float | None = None  # the lowest cross-tray GPU pair
    worst: str | None = None  # that pair, `node/GPU r <- node/GPU c`
    worst_nodes: tuple[str, ...] = ()  # the nodes of that pair (where the Event goes)


class Runner(Protocol):
    """Runs the check (fabriccheckrun.py; a test hands in its own): across `gpus`' nodes, in
    that order, with that many GPUs each; every cross-node GPU pair held to `threshold_gbs`."""

    def run(self, fabric: str, gpus: Mapping[str, int], threshold_gbs: float) -> CheckResult: ...

    def cleanup(self) -> None:
        """Delete what an earlier run left behind (a controller that stopped mid-check)."""
        ...

    def all_reduce(
        self, key: str, nodes: Sequence[str], per_node: int, *, multiple_cliques: bool
    ) -> tuple[str | None, str]:
        """nccl-tests all_reduce_perf over `nodes` (the measured loss, fabricloss.py): its
        output, else None and why it did not run."""
        ...


# --- pure decisions ----------------------------------------------------------------------


def members(
    nodes: Iterable[JSON],
    hardware: Mapping[str, str],
    held: Callable[[str], bool],
    *,
    require_verified: bool,
) -> dict[str, str]:
    """Node -> hardware fingerprint, for the domain's nodes the check may use now: they can take
    a pod (capacity.unusable, with the per-node label where required), are idle (`held`
    false: no ComputeDomain holds them and no claim holds a GPU of theirs, FabricCheck.busy),
    and their per-node gate is open (`hardware`: hardware_fingerprint, "" otherwise)."""
    out: dict[str, str] = {}
    for node in nodes:
        name = node["metadata"]["name"]
        fp = hardware.get(name, "")
        if not fp or held(name) or capacity.unusable(node, require_verified=require_verified):
            continue
        out[name] = fp
    return out


def gpu_claims(node: str, slices: Iterable[JSON], claims: Iterable[JSON]) -> list[str]:
    """The claims (`namespace/name`) allocated a GPU or MIG device of `node` (its
    devices.fabricdra.io slices): a job runs there, and the check's workers, privileged with
    every GPU, would share the tray with it. Admin access (monitoring) holds nothing."""
    gpus = {dev.name for dev in capacity.devices(slices).values() if dev.type in capacity.GPU_TYPES}
    out = set()
    for claim in claims:
        for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []:
            if (
                r.get("driver") == capacity.DRIVER
                and r.get("pool") == node
                and r.get("device") in gpus
                and r.get("adminAccess") is not True
            ):
                meta = claim.get("metadata") or {}
                out.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return sorted(out)


def unmeasured(fabric: str, domain_nodes: Iterable[JSON]) -> bool:
    """Whether no passed record of the domain's nodes carries a measured loss (a failed
    measurement is one too: it is not run again until the domain is checked again)."""
    for node in domain_nodes:
        record = record_of(node)
        if record is not None and record.fabric == fabric and record.measuredLoss is not None:
            return False
    return True


def membership_fingerprint(member_fps: Mapping[str, str]) -> str:
    lines = "\n".join(f"{n} {fp}" for n, fp in sorted(member_fps.items()))
    return hashlib.sha256(lines.encode()).hexdigest()[:32]


def covered(node: JSON, fabric: str, hardware_fp: str) -> bool:
    """Whether a check passed with this node, in this domain, on the hardware it has now."""
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    record = record_of(node)
    return (
        node_labels.get(labels.FABRIC_VERIFIED) == "true"
        and record is not None
        and record.passed
        and record.fabric == fabric
        and record.nodeFingerprint == hardware_fp
    )


@dataclass(frozen=True)
class Plan:
    # none: nothing to do; wait: cannot check yet; pass: label without a run; run: check
    action: Literal["none", "wait", "pass", "run"]
    nodes: tuple[str, ...] = ()
    fingerprint: str = ""
    reason: str = ""


def plan(
    fabric: str,
    domain_nodes: Sequence[JSON],
    member_fps: Mapping[str, str],
    threshold_gbs: float | None,
    classes: Sequence[str] = (),
) -> Plan:
    """What to do for `fabric` now (see the module docstring)."""
    by_name = {n["metadata"]["name"]: n for n in domain_nodes}
    uncovered = sorted(m for m, fp in member_fps.items() if not covered(by_name[m], fabric, fp))
    if not uncovered:
        return Plan("none", reason="every idle verified node passed a check already")
    fp = membership_fingerprint(member_fps)
    everyone = tuple(sorted(member_fps))
    if len(domain_nodes) == 1:
        return Plan("pass", everyone, fp, ONE_NODE)
    if not classes:
        return Plan("wait", tuple(uncovered), fp, "its nodes publish no GPU yet")
    if threshold_gbs is None:
        return Plan(
            "pass",
            everyone,
            fp,
            f"no GPU-to-GPU bandwidth figure (gpuBandwidthGBs) for {', '.join(classes)}: "
            "nothing to hold",
        )
    if len(member_fps) < 2:
        return Plan(
            "wait",
            tuple(uncovered),
            fp,
            "a second idle verified node of the domain is needed to check against",
        )
    return Plan("run", everyone, fp)


def threshold(classes: Iterable[str]) -> float | None:
    """The per-pair floor: the lowest `gpuBandwidthGBs` of the GPU classes present (a class
    without one holds nothing; None when none has one)."""
    table = load_expectations()
    figures = [table.for_gpu(c).gpuBandwidthGBs for c in classes]
    held = [f for f in figures if f is not None]
    return min(held) if held else None


@dataclass(frozen=True)
class NodeWrite:
    node: str
    label: bool | None  # True: set fabric-verified; False: remove it; None: leave it
    record: FabricCheckRecord | None = None


@dataclass(frozen=True)
class Writes:
    nodes: list[NodeWrite]
    events: list[tuple[str, Event]] = field(default_factory=list)  # node -> Event


def outcome(
    fabric: str,
    p: Plan,
    result: CheckResult,
    domain_nodes: Sequence[JSON],
    member_fps: Mapping[str, str],
    threshold_gbs: float | None,
    now: datetime,
    loss: MeasuredLoss | None = None,
) -> Writes:
    """The Node writes and Events a check's result calls for (`loss`: the measured loss run
    after it passed, kept on the passed records)."""

    def record(node: str, passed: bool) -> FabricCheckRecord:
        return FabricCheckRecord(
            fabric=fabric,
            passed=passed,
            reason=result.reason,
            time=now,
            fingerprint=p.fingerprint,
            nodeFingerprint=member_fps.get(node, ""),
            nodes=list(p.nodes),
            thresholdGBs=threshold_gbs,
            minGBs=result.min_gbs,
            worst=result.worst,
            measuredLoss=loss if passed else None,
        )

    if result.outcome == "Passed":
        return Writes([NodeWrite(n, True, record(n, True)) for n in p.nodes])
    if result.outcome == "NotRun":
        ev = Event("Warning", "FabricCheckNotRun", f"fabric domain {fabric}: {result.reason}")
        return Writes([], [(n, ev) for n in p.nodes])
    # Only the trays it measured: one a running domain holds was not in the check, nothing
    # was measured on it, and its own passed record still stands (issue 29 point 10).
    writes = [NodeWrite(n, False, record(n, False)) for n in p.nodes]
    ev = Event(
        "Warning",
        "FabricCheckFailed",
        f"fabric domain {fabric}: multi-node NVLink check failed: {result.reason}",
    )
    at = [n for n in result.worst_nodes if n in p.nodes] or list(p.nodes)
    return Writes(writes, [(n, ev) for n in at])


def node_patch(write: NodeWrite) -> JSON:
    """A merge patch of the Node for `write` (labels and the record only)."""
    meta: JSON = {}
    if write.label is not None:
        meta["labels"] = {labels.FABRIC_VERIFIED: "true" if write.label else None}
    if write.record is not None:
        meta["annotations"] = {labels.FABRIC_CHECK: dump(write.record)}
    return {"metadata": meta}


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` failed or not-run checks in a row."""
    return float(min(RETRY_FIRST * 2.0 ** max(failures - 1, 0), RETRY_MAX))


OFFERED = ("Verified", "Overridden")  # the per-node gate states that offer the devices


def hardware_fingerprint(node_devices: JSON | None) -> str:
    """A node's hardware fingerprint as its agent publishes it (NodeDevices
    status.verification: `currentFingerprint`, else the last run's `fingerprint`), "" unless
    its per-node gate is open (Verified or Overridden): only verified nodes are checked,
    whether or not gang placement requires the per-node label."""
    v = ((node_devices or {}).get("status") or {}).get("verification") or {}
    if v.get("state") not in OFFERED:
        return ""
    return str(v.get("currentFingerprint") or v.get("fingerprint") or "")


def node_devices_view(obj: JSON) -> JSON:
    """A NodeDevices object cut down to what the check and the scale-out tier labels read (an
    informer transform): the verification fingerprints, and each RDMA interface's name and
    scale-out facts (tierlabels.py). The rest of the inventory is large and not read here."""
    meta = obj.get("metadata") or {}
    v = (obj.get("status") or {}).get("verification") or {}
    kept = {k: v[k] for k in ("state", "fingerprint", "currentFingerprint") if k in v}
    interfaces = [
        {k: i[k] for k in ("name", "rdma", "rdmaDevice", "scaleOut") if k in i}
        for i in ((obj.get("spec") or {}).get("interfaces") or [])
        if i.get("rdma") and i.get("scaleOut")
    ]
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta},
        "spec": {"interfaces": interfaces},
        "status": {"verification": kept},
    }


# --- the reconciler (I/O) ----------------------------------------------------------------


@dataclass
class _Pending:
    """Records just written, not yet seen in the Node cache: deciding from the cache before it
    shows them would find the checked nodes uncovered and run the check again."""

    records: dict[str, str]  # node -> the annotation written
    until: float  # past this, stop waiting (someone else changed the Node since)


PENDING_WAIT = 30.0


@dataclass
class _Backoff:
    members: dict[str, str]  # node -> hardware fingerprint, of the run that failed
    failures: int
    not_before: float

    def holds(self, member_fps: Mapping[str, str]) -> bool:
        """Whether the backoff still applies: no node is new or has new hardware since (a
        subset does not end it: the nodes the check's own ComputeDomain still holds while it
        is deleted, or a node a workload took meanwhile)."""
        return all(self.members.get(n) == fp for n, fp in member_fps.items())


class FabricCheck:
    """Reconciles one fabric domain at a time (its key is the domain's name)."""

    def __init__(self, deps: FabricCheckDeps) -> None:
        self.d = deps
        self._lock = threading.Lock()
        self._backoff: dict[str, _Backoff] = {}
        self._pending: dict[str, _Pending] = {}
        self._state: dict[str, str] = {}  # fabric -> what its check is doing (`state`)

    def state(self, fabric: str) -> str:
        """What the fabric domain's check is doing, in words, for a gang that waits for it
        ("" when nothing to say: passed, or not reconciled yet). Leader memory: a new leader
        says it again at its first reconcile of the domain."""
        with self._lock:
            return self._state.get(fabric, "")

    def _say(self, fabric: str, state: str) -> None:
        with self._lock:
            before = self._state.get(fabric, "")
            if state:
                self._state[fabric] = state
            else:
                self._state.pop(fabric, None)
        if before != state:
            self.d.state_changed(fabric)

    def busy(self, node: str) -> bool:
        """Not idle: a ComputeDomain holds the node, or a claim holds one of its GPUs (a
        single-node GPU job has no ComputeDomain)."""
        if self.d.held(node):
            return True
        slices = self.d.device_slices.by_index(BY_NODE, node)
        return bool(gpu_claims(node, slices, self.d.allocations.by_index(BY_NODE, node)))

    def gpus(self, nodes: Iterable[str]) -> dict[str, list[str]]:
        """Node -> the device classes of the GPUs it publishes (capacity.devices), one entry
        per GPU; nodes that publish none are absent."""
        out: dict[str, list[str]] = {}
        for node in nodes:
            for dev in capacity.devices(self.d.device_slices.by_index(BY_NODE, node)).values():
                if dev.type == "gpu":
                    out.setdefault(node, []).append(dev.device_class)
        return out

    def measure_loss(
        self, fabric: str, checked: Sequence[str], gpus: Mapping[str, Sequence[str]]
    ) -> MeasuredLoss:
        """The same all-reduce on two trays the check just passed (one IMEX domain) and on the
        first of them and an idle, checked tray of another NVLink domain (fabricloss.py)."""
        d = self.d
        first, second = checked[0], checked[1]
        in_nodes = [first, second]
        output, why = d.runner.all_reduce(
            f"{fabric}/loss-in-domain",
            in_nodes,
            min(len(gpus.get(n, [])) for n in in_nodes),
            multiple_cliques=False,
        )
        in_domain = (
            fabricloss.reading(output, in_nodes, [fabric])
            if output is not None
            else fabricloss.failed(in_nodes, [fabric], why)
        )
        tier1 = {}
        candidates = []
        for node in d.nodes.items():
            name = node["metadata"]["name"]
            tier1[name] = ((node["metadata"].get("labels") or {}).get(TIER_LABELS[0])) or ""
            other = capacity.in_fabric(node)
            if not other or other == fabric or self.state(other) or self.busy(name):
                continue  # its own domain's check is doing something there
            if covered(node, other, hardware_fingerprint(d.node_devices.get(name))):
                candidates.append((name, other))
        partner = fabricloss.split_partner(first, tier1, candidates)
        if partner is None:
            split = fabricloss.failed(
                [first],
                [fabric],
                "no idle tray of another NVLink domain that passed its own check to split across",
            )
        else:
            split_nodes = [first, partner]
            split_fabrics = [fabric, dict(candidates)[partner]]
            per_node = min(len(gpus.get(first, [])), len(self.gpus([partner]).get(partner, [])))
            output, why = d.runner.all_reduce(
                f"{fabric}/loss-split", split_nodes, per_node, multiple_cliques=True
            )
            split = (
                fabricloss.reading(output, split_nodes, split_fabrics)
                if output is not None
                else fabricloss.failed(split_nodes, split_fabrics, why)
            )
        loss = fabricloss.measured(in_domain, split, d.now(), fabric)
        log.info(
            "measured loss from fabric domain %s: in-domain %s, split %s, ratio %s",
            fabric,
            in_domain.stepTimeMs or in_domain.error,
            split.stepTimeMs or split.error,
            loss.ratio,
        )
        return loss

    def _measure_only(
        self,
        fabric: str,
        domain_nodes: Sequence[JSON],
        idle: Sequence[str],
        gpus: Mapping[str, Sequence[str]],
    ) -> None:
        """The loss on a domain whose check passed already: added to its passed records."""
        loss = self.measure_loss(fabric, idle, gpus)
        written: dict[str, str] = {}
        for node in domain_nodes:
            record = record_of(node)
            if record is None or not record.passed or record.fabric != fabric:
                continue
            value = dump(record.model_copy(update={"measuredLoss": loss}))
            name = node["metadata"]["name"]
            self.d.patch_node(name, {"metadata": {"annotations": {labels.FABRIC_CHECK: value}}})
            written[name] = value
        if written:
            with self._lock:
                self._pending[fabric] = _Pending(written, self.d.clock() + PENDING_WAIT)

    def _cache_behind(self, fabric: str) -> bool:
        """Whether the Node cache does not show this domain's last written records yet."""
        with self._lock:
            pending = self._pending.get(fabric)
        if pending is None:
            return False
        if self.d.clock() < pending.until:
            for name, value in pending.records.items():
                node = self.d.nodes.get(name)
                annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
                if node is not None and annotations.get(labels.FABRIC_CHECK) != value:
                    return True
        with self._lock:
            self._pending.pop(fabric, None)
        return False

    def reconcile(self, fabric: str) -> None:
        d = self.d
        d.require_synced()
        if not fabric or fabric == labels.NO_FABRIC:
            return
        if self._cache_behind(fabric):
            d.requeue_after(fabric, 1.0)
            return
        domain_nodes = d.nodes.by_index(BY_FABRIC, fabric)
        hardware = {
            n["metadata"]["name"]: hardware_fingerprint(d.node_devices.get(n["metadata"]["name"]))
            for n in domain_nodes
        }
        member_fps = members(
            domain_nodes, hardware, self.busy, require_verified=d.require_verified_nodes
        )
        gpus = self.gpus(member_fps)
        classes = sorted({c for found in gpus.values() for c in found})
        floor = threshold(classes)
        p = plan(fabric, domain_nodes, member_fps, floor, classes)
        if p.action == "none":
            self._say(fabric, "")
            if d.measure_loss and len(member_fps) >= 2 and unmeasured(fabric, domain_nodes):
                # Checks that passed before the loss was asked for (or by a controller
                # without it): measure once now, without checking again.
                self._measure_only(fabric, domain_nodes, sorted(member_fps), gpus)
            return
        if p.action == "wait":
            log.info("fabric check of %s waits: %s (%s)", fabric, p.reason, ", ".join(p.nodes))
            self._say(fabric, f"the check waits: {p.reason}")
            return
        if p.action == "pass":
            result = CheckResult("Passed", p.reason)
        else:
            with self._lock:
                b = self._backoff.get(fabric)
            if b is not None and b.holds(member_fps):
                left = b.not_before - d.clock()
                if left > 0:
                    d.requeue_after(fabric, left)
                    return
            assert floor is not None
            log.info("fabric check of %s over %s", fabric, ", ".join(p.nodes))
            if b is None:  # a retry keeps saying why the last try failed or did not run
                self._say(fabric, f"the check is running over {len(p.nodes)} nodes")
            result = d.runner.run(fabric, {n: len(gpus.get(n, [])) for n in p.nodes}, floor)
        self._finish(fabric, p, result, domain_nodes, member_fps, floor, gpus)

    def _finish(
        self,
        fabric: str,
        p: Plan,
        result: CheckResult,
        domain_nodes: Sequence[JSON],
        member_fps: Mapping[str, str],
        floor: float | None,
        gpus: dict[str, list[str]],
    ) -> None:
        """A check's outcome: measure the loss after a pass (when asked), write the records
        and Events, and back off after a failure."""
        d = self.d
        loss = None
        if result.outcome == "Passed" and p.action == "run" and d.measure_loss:
            loss = self.measure_loss(fabric, p.nodes, gpus)
        writes = outcome(fabric, p, result, domain_nodes, member_fps, floor, d.now(), loss)
        written: dict[str, str] = {}
        for w in writes.nodes:
            d.patch_node(w.node, node_patch(w))
            if w.record is not None:
                written[w.node] = dump(w.record)
        if written:
            with self._lock:
                self._pending[fabric] = _Pending(written, d.clock() + PENDING_WAIT)
        for node, ev in writes.events:
            d.node_event(node, ev)
        said = {"Passed": "", "Failed": "the check failed", "NotRun": "the check did not run"}
        self._say(
            fabric, f"{said[result.outcome]}: {result.reason}" if said[result.outcome] else ""
        )
        if result.outcome == "Passed":
            log.info("fabric check of %s passed: %s", fabric, result.reason)
            with self._lock:
                self._backoff.pop(fabric, None)
            return
        with self._lock:
            b = self._backoff.get(fabric)
            failures = b.failures + 1 if b is not None and b.holds(member_fps) else 1
            delay = retry_delay(failures)
            self._backoff[fabric] = _Backoff(dict(member_fps), failures, d.clock() + delay)
        log.warning(
            "fabric check of %s %s: %s (again in %.0fs)",
            fabric,
            "failed" if result.outcome == "Failed" else "did not run",
            result.reason,
            delay,
        )
        d.requeue_after(fabric, delay)
