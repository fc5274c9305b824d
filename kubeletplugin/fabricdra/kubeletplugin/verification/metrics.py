"""Prometheus metrics of verification, on the node agent's registry (docs/verification.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from fabricdra.api.verification import PROBES, ProbeResult, Verification

from ..metrics import REGISTRY

STATES = ("Verified", "Unverified", "Failed", "Overridden")
OUTCOMES = ("Passed", "Failed", "NotRun", "Skipped")

STATE = Gauge(
    "fabricdra_verification_state",
    "1 for the node's current verification gate state, 0 for the others.",
    ["state"],
    registry=REGISTRY,
)
PROBE_RESULTS = Gauge(
    "fabricdra_verification_probe_results",
    "Results of the last verification run, by probe and outcome.",
    ["probe", "outcome"],
    registry=REGISTRY,
)
LAST_RUN = Gauge(
    "fabricdra_verification_last_run_timestamp_seconds",
    "When the last verification run finished (Unix time).",
    registry=REGISTRY,
)
RUNS = Counter(
    "fabricdra_verification_runs_total",
    "Verification runs, by result (passed, failed).",
    ["result"],
    registry=REGISTRY,
)


def record_run(probes: list[ProbeResult], passed: bool, finished: float) -> None:
    RUNS.labels("passed" if passed else "failed").inc()
    LAST_RUN.set(finished)
    counts: dict[tuple[str, str], int] = {}
    for r in probes:
        counts[(r.probe, r.outcome)] = counts.get((r.probe, r.outcome), 0) + 1
    for probe in PROBES:
        for outcome in OUTCOMES:
            PROBE_RESULTS.labels(probe, outcome).set(counts.get((probe, outcome), 0))


def record_state(state: Verification | None) -> None:
    for s in STATES:
        STATE.labels(s).set(1 if state is not None and state.state == s else 0)
