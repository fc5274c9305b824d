"""Verified discovery: probes that check a node's hardware works as its class promises.

Pure of the API: `run_probes` reads the discovery records, sysfs and NVML's answers (live or
recorded) and runs the bandwidth tools present on the node, returning typed `ProbeResult`s;
`gate.decide` turns the last run, the node's current fingerprint and any manual override into
the gate state the publisher applies (docs/verification.md).
"""

from .fingerprint import fingerprint
from .gate import (
    OVERRIDE_ANNOTATION,
    REVERIFY_ANNOTATION,
    GateInput,
    VerificationRun,
    decide,
    gate_of,
    override_from_annotation,
    run_passed,
)
from .probes import ErrorBaseline, SystemChoice, Tools, choose_system, run_probes

__all__ = [
    "OVERRIDE_ANNOTATION",
    "REVERIFY_ANNOTATION",
    "ErrorBaseline",
    "GateInput",
    "SystemChoice",
    "Tools",
    "VerificationRun",
    "choose_system",
    "decide",
    "fingerprint",
    "gate_of",
    "override_from_annotation",
    "run_passed",
    "run_probes",
]
