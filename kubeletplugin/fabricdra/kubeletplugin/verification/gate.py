"""The verification gate: the last run + the node's fingerprint now + any override -> the state.

    Verified     the last run passed, on the hardware and drivers the node has now
    Failed       the last run had a probe that failed
    Unverified   no run yet; a required probe could not run; or the fingerprint changed since
                 the last run (a repair, a swapped device, a driver upgrade): the old result
                 no longer speaks for the node
    Overridden   an operator marked the node verified (`fabricdra verify --override`) for the
                 hardware it has now, and the override has not expired; the last run is still
                 recorded next to it. An override given for other hardware (its fingerprint is
                 not the node's now), expired, or naming no fingerprint or expiry is not
                 applied: the state is what the last run says, and `overrideIgnored` says why

Only Verified and Overridden nodes have their devices offered (docs/verification.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

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


def override_problem(override: Override, fingerprint_now: str, now: datetime) -> str | None:
    """Why `override` does not apply to the node as it is now (None: it applies)."""
    if not override.fingerprint:
        return "override names no hardware fingerprint: not applied (set it with fabricdra verify)"
    if override.expires is None:
        return "override has no expiry: not applied (set it with fabricdra verify)"
    if override.fingerprint != fingerprint_now:
        return (
            f"override was given for hardware {override.fingerprint}, the node is now "
            f"{fingerprint_now} (a repair or driver change): not applied"
        )
    expires = override.expires
    if expires.tzinfo is None:  # a hand-written timestamp without a zone: read as UTC
        expires = expires.replace(tzinfo=UTC)
    if expires <= now:
        return f"override expired at {_stamp(expires)}: not applied"
    return None


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def decide(
    run: VerificationRun | None,
    fingerprint_now: str,
    override: Override | None,
    now: datetime | None = None,
) -> Verification:
    """The gate state; `now` (default: the clock) decides whether the override expired."""
    ignored = None
    if override is not None:
        ignored = override_problem(override, fingerprint_now, now or datetime.now(UTC))
    applied = override if ignored is None else None

    def record(state: GateState, reason: str) -> Verification:
        if run is None:
            return Verification(
                state=state,
                reason=reason,
                override=applied,
                currentFingerprint=fingerprint_now,
                overrideIgnored=ignored,
            )
        return Verification(
            state=state,
            reason=reason,
            time=run.time,
            fingerprint=run.fingerprint,
            passed=run.passed,
            probes=run.probes,
            override=applied,
            currentFingerprint=fingerprint_now,
            overrideIgnored=ignored,
        )

    if applied is not None:
        return record("Overridden", f"marked verified by hand: {applied.reason}")
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
    """The node annotation `fabricdra.io/verification-override` (JSON {reason, by, time,
    fingerprint, expires}, as `fabricdra verify --override` writes it; plain text is taken as
    the reason, and such an override, bound to no hardware, is not applied by `decide`)."""
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
