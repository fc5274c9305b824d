"""When the node agent runs verification, and the run itself (probes -> `VerificationRun`).

A run is due at start-up (before the first publish, so a new node is never offered on trust),
when the node's fingerprint changes (a repair, a swapped device, a driver change), when the
schedule says so (`interval`, measured from the last run) and when asked (`request`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from fabricdra.api.inventory import Accelerator, Interface
from fabricdra.api.verification import Expectations, Verification, load_expectations

from ..discovery.nvml import NvmlReadings
from ..discovery.sysfs import SysfsTree
from . import metrics
from .gate import VerificationRun, run_passed
from .probes import Tools, run_probes

log = structlog.get_logger("fabricdra.verification")

# Why a run is due (`Schedule.due`).
FIRST_RUN = "first run"
CHANGED = "hardware or drivers changed"
REQUESTED = "requested"
SCHEDULED = "schedule"


def run_once(
    tree: SysfsTree,
    interfaces: list[Interface],
    accelerators: list[Accelerator],
    nvml: NvmlReadings | None,
    fingerprint: str,
    *,
    expectations: Expectations | None = None,
    tools: Tools | None = None,
) -> VerificationRun:
    table = expectations or load_expectations()
    probes = run_probes(tree, interfaces, accelerators, nvml, table, tools or Tools())
    passed, reason = run_passed(probes, table)
    finished = datetime.now(UTC).replace(microsecond=0)
    metrics.record_run(probes, passed, finished.timestamp())
    return VerificationRun(finished, fingerprint, probes, passed, reason)


@dataclass
class Schedule:
    interval: float = 24 * 3600.0  # seconds between runs on an unchanged node; 0: never again
    requested: bool = False
    last_run: VerificationRun | None = None
    _last_monotonic: float = field(default=0.0, repr=False)

    def due(self, fingerprint: str) -> str | None:
        """Why a run is due now, or None."""
        if self.last_run is None:
            return FIRST_RUN
        if self.last_run.fingerprint != fingerprint:
            return CHANGED
        if self.requested:
            return REQUESTED
        if self.interval > 0 and time.monotonic() - self._last_monotonic >= self.interval:
            return SCHEDULED
        return None

    def restore(self, recorded: Verification | None) -> bool:
        """Take the last run from the record a previous agent wrote (its time sets the
        schedule), so a restart on unchanged hardware neither re-taints nor reruns early."""
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
        self._last_monotonic = time.monotonic() - age
        return True

    def ran(self, run: VerificationRun) -> None:
        self.last_run = run
        self.requested = False
        self._last_monotonic = time.monotonic()
        log.info(
            "verification run finished",
            passed=run.passed,
            reason=run.reason,
            failed=[f"{p.probe} {p.device}" for p in run.probes if p.outcome == "Failed"],
        )
