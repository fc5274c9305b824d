"""When the node agent runs verification, and the run itself (probes -> `VerificationRun`).

A run is due at start-up (before the first publish, so a new node is never offered on trust —
and after an agent restart: the recorded verdict keeps the gate meanwhile, but a restart is
often the operator's "try again"), when the node's fingerprint changes (a repair, a swapped
device, a driver change), when the schedule says so (`interval`, measured from the last run),
when asked (`request`, the `fabricdra.io/reverify` annotation), and after a run that did not
pass: retried with a backoff (`RETRY_FIRST` doubling to `RETRY_MAX`), because what failed is
often transient (NVLink still training at boot, a link recovering) and a node must not stay
gated a whole `interval` for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from fabricdra.api.inventory import Accelerator, Interface
from fabricdra.api.verification import (
    ACTIVE_PROBES,
    Expectations,
    ProbeResult,
    SystemProfile,
    Verification,
    load_expectations,
)

from ..discovery.nvml import NvmlReadings
from ..discovery.sysfs import SysfsTree
from . import metrics
from .gate import VerificationRun, run_passed
from .probes import ErrorBaseline, Tools, choose_system, run_probes

log = structlog.get_logger("fabricdra.verification")

# Why a run is due (`Schedule.due`).
FIRST_RUN = "first run"
CHANGED = "hardware or drivers changed"
REQUESTED = "requested"
SCHEDULED = "schedule"
RESTARTED = "agent restarted"
RETRY = "retry after a run that did not pass"

RETRY_FIRST = 60.0  # seconds after a run that did not pass; doubles per further miss
RETRY_MAX = 3600.0  # the longest wait between retries


def run_once(
    tree: SysfsTree,
    interfaces: list[Interface],
    accelerators: list[Accelerator],
    nvml: NvmlReadings | None,
    fingerprint: str,
    *,
    expectations: Expectations | None = None,
    tools: Tools | None = None,
    expect: SystemProfile | None = None,
    baseline: ErrorBaseline | None = None,
    busy: str | None = None,
    previous: VerificationRun | None = None,
) -> VerificationRun:
    """One run. `expect`: the operator's system profile (None: the built-in one DMI names);
    `baseline`: where the error counters' window starts (None: at this run's first reading);
    `busy`: why the node is not idle — its active probes are not run, and the last run's
    results for them (`previous`, on the same fingerprint) are kept, said so."""
    table = expectations or load_expectations()
    probes = run_probes(
        tree,
        interfaces,
        accelerators,
        nvml,
        table,
        tools or Tools(),
        system=choose_system(tree, expect),
        baseline=baseline,
        busy=busy,
    )
    if busy is not None and previous is not None and previous.fingerprint == fingerprint:
        probes = carried_over(probes, previous)
    passed, reason = run_passed(probes, table)
    finished = datetime.now(UTC).replace(microsecond=0)
    metrics.record_run(probes, passed, finished.timestamp())
    return VerificationRun(finished, fingerprint, probes, passed, reason)


def carried_over(probes: list[ProbeResult], previous: VerificationRun) -> list[ProbeResult]:
    """A busy node's active probes: the last run's results on the same hardware, each saying
    where it comes from (a busy node is not re-measured, nor gated for being busy)."""
    before = {(r.probe, r.device): r for r in previous.probes if r.probe in ACTIVE_PROBES}
    stamp = previous.time.isoformat()
    out = []
    for r in probes:
        old = before.get((r.probe, r.device))
        if r.probe in ACTIVE_PROBES and r.outcome == "NotRun" and old is not None:
            note = f"from the run at {stamp} ({r.reason})"
            r = old.model_copy(update={"reason": f"{old.reason}; {note}" if old.reason else note})
        out.append(r)
    return out


@dataclass
class Schedule:
    interval: float = 24 * 3600.0  # seconds between runs on an unchanged node; 0: never again
    requested: bool = False
    last_run: VerificationRun | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    runs: int = 0  # runs this agent did (a restored record is not one)
    misses: int = 0  # runs in a row that did not pass
    restored: bool = False  # last_run came from the record; this agent has not run yet
    # The error counters' window start, kept across runs (cleared: a fresh window).
    baseline: ErrorBaseline = field(default_factory=ErrorBaseline)
    _last_monotonic: float = field(default=0.0, repr=False)

    def due(self, fingerprint: str) -> str | None:
        """Why a run is due now, or None."""
        if self.last_run is None:
            return FIRST_RUN
        if self.last_run.fingerprint != fingerprint:
            return CHANGED
        if self.requested:
            return REQUESTED
        if self.restored:
            return RESTARTED
        since = self.clock() - self._last_monotonic
        if not self.last_run.passed and since >= self.retry_after():
            return RETRY
        if self.interval > 0 and since >= self.interval:
            return SCHEDULED
        return None

    def retry_after(self) -> float:
        """Seconds after a run that did not pass until the next try: doubling, capped (and
        never longer than the schedule itself)."""
        wait: float = min(RETRY_FIRST * 2.0 ** max(0, self.misses - 1), RETRY_MAX)
        return min(wait, self.interval) if self.interval > 0 else wait

    def request(self) -> None:
        """Run at the next pass, with a fresh error-counter window: asked after a repair,
        whose own link flaps must not count against it."""
        self.requested = True
        self.baseline.clear()

    def restore(self, recorded: Verification | None) -> bool:
        """Take the last run from the record a previous agent wrote (its time sets the
        schedule): it keeps the gate as it was — a restart on unchanged hardware does not
        re-taint — while this agent reruns (`RESTARTED`) instead of keeping the old verdict."""
        if recorded is None or recorded.time is None or recorded.fingerprint is None:
            return False
        if recorded.passed is None:
            return False
        self.last_run = VerificationRun(
            recorded.time,
            recorded.fingerprint,
            list(recorded.probes),
            recorded.passed,
            recorded.reason if recorded.state != "Overridden" else "restored from the record",
        )
        age = max(0.0, datetime.now(UTC).timestamp() - recorded.time.timestamp())
        self._last_monotonic = self.clock() - age
        self.restored = True
        return True

    def ran(self, run: VerificationRun) -> None:
        self.misses = 0 if run.passed else self.misses + 1
        self.last_run = run
        self.requested = False
        self.restored = False
        self.runs += 1
        self._last_monotonic = self.clock()
        log.info(
            "verification run finished",
            passed=run.passed,
            reason=run.reason,
            failed=[f"{p.probe} {p.device}" for p in run.probes if p.outcome == "Failed"],
        )
