"""The verification gate: the last run + the node's fingerprint now + any override -> the state.

    Verified     the last run passed, on the hardware and drivers the node has now
    Failed       the last run had a probe that failed
    Unverified   no run yet; a required probe could not run; or the fingerprint changed since
                 the last run (a repair, a swapped device, a driver upgrade): the old result
                 no longer speaks for the node
    Overridden   an operator marked the node verified (`fabricdra verify --override`); the
                 last run is still recorded next to it

Only Verified and Overridden nodes have their devices offered (docs/verification.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from fabricdra.api.verification import (
    Expectations,
    GateState,
    Override,
    ProbeResult,
    Verification,
)

from ..resourceslices import Gate

OVERRIDE_ANNOTATION = "fabricdra.io/verification-override"
# Set by `fabricdra verify --node NAME` (after a repair): the agent reruns verification with a
# fresh error-counter window at its next pass, then removes the annotation.
REVERIFY_ANNOTATION = "fabricdra.io/reverify"


@dataclass(frozen=True)
class VerificationRun:
    """One finished run: when, on which fingerprint, and what each probe found."""

    time: datetime
    fingerprint: str
    probes: list[ProbeResult]
    passed: bool
    reason: str


@dataclass(frozen=True)
class GateInput:
    """What the publisher needs to apply the gate: the last run (None: none yet) and the
    fingerprint of the node as discovered now."""

    run: VerificationRun | None
    fingerprint: str


def gate_of(state: Verification | None) -> Gate | None:
    """The gate a state puts on the node's devices (None: no gate in use)."""
    if state is None:
        return None
    if state.offered:
        return "verified"
    return "failed" if state.state == "Failed" else "unverified"


def run_passed(probes: list[ProbeResult], expectations: Expectations) -> tuple[bool, str]:
    """(passed, why): no probe failed, and every probe its class requires ran and passed."""
    failed = [r for r in probes if r.outcome == "Failed"]
    if failed:
        return False, "failed: " + "; ".join(f"{r.probe} on {r.device}" for r in failed[:5]) + (
            f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        )
    required = {c.name: set(c.required) for c in expectations.classes}
    missing = [
        r for r in probes if r.outcome == "NotRun" and r.probe in required.get(r.deviceClass, ())
    ]
    if missing:
        return False, "required probes did not run: " + "; ".join(
            f"{r.probe} on {r.device} ({r.reason})" for r in missing[:5]
        )
    return True, f"{sum(r.outcome == 'Passed' for r in probes)} probes passed"


def decide(
    run: VerificationRun | None, fingerprint_now: str, override: Override | None
) -> Verification:
    def record(state: GateState, reason: str) -> Verification:
        if run is None:
            return Verification(state=state, reason=reason, override=override)
        return Verification(
            state=state,
            reason=reason,
            time=run.time,
            fingerprint=run.fingerprint,
            passed=run.passed,
            probes=run.probes,
            override=override,
        )

    if override is not None:
        return record("Overridden", f"marked verified by hand: {override.reason}")
    if run is None:
        return record("Unverified", "no verification run yet")
    if run.fingerprint != fingerprint_now:
        return record(
            "Unverified",
            "hardware or drivers changed since the last run (a repair, a swapped device or a "
            "driver change): a new run must pass",
        )
    if run.passed:
        return record("Verified", run.reason)
    failed = any(p.outcome == "Failed" for p in run.probes)
    return record("Failed" if failed else "Unverified", run.reason)


def override_from_annotation(value: str | None) -> Override | None:
    """The node annotation `fabricdra.io/verification-override` (JSON {reason, by, time}, as
    `fabricdra verify --override` writes it; plain text is taken as the reason)."""
    if value is None or not value.strip():
        return None
    try:
        doc = json.loads(value)
    except json.JSONDecodeError:
        return Override(reason=value.strip())
    if isinstance(doc, dict) and "reason" in doc:
        try:
            return Override.model_validate(doc)
        except ValueError:
            pass
    return Override(reason=value.strip())
