"""The multi-node NVLink check's record on a Node (annotation `fabricdra.io/fabric-check`):
written by the ComputeDomain controller for every node a check covered, read back by it (a
restarted controller does not run a passed check again) and by gang placement (why a node is
not offered), and for the operator (`kubectl get node -o yaml`). docs/verification.md,
"Multi-node NVLink (fabric domains)"."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import labels


class LossReading(BaseModel):
    """One placement's nccl-tests all_reduce_perf run (out-of-place, at `messageBytes`). A run
    that failed has `error` and no figures: never a zero."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    nodes: list[str] = Field(default_factory=list, description="The trays it ran on.")
    fabricDomains: list[str] = Field(
        default_factory=list, description="Their NVLink fabric domains (one: in-domain)."
    )
    messageBytes: int | None = Field(default=None, description="The all-reduce's size (B).")
    busBwGBps: float | None = Field(
        default=None, description="nccl-tests' out-of-place busbw at that size (GB/s)."
    )
    stepTimeMs: float | None = Field(
        default=None,
        description="nccl-tests' out-of-place time of one all-reduce at that size (ms): the "
        "benchmark's step, not a training step.",
    )
    error: str = Field(default="", description="Why there is no figure (empty when measured).")


class MeasuredLoss(BaseModel):
    """The same all-reduce inside one NVLink domain and split across two (issue 28 point 7,
    docs/scale-out.md "Measuring the loss"), run by the fabric check after it passed."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    inDomain: LossReading
    split: LossReading
    ratio: float | None = Field(
        default=None,
        description="split stepTimeMs / inDomain stepTimeMs (above 1: the split is slower); "
        "absent unless both were measured.",
    )
    measuredAt: datetime = Field(description="When the runs finished.")
    source: str = Field(description="What ran them, and in which fabric domain's check.")


class FabricCheckRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    fabric: str = Field(description="The fabric domain the check ran in.")
    passed: bool
    reason: str = Field(description="Why it passed or failed, in words.")
    time: datetime = Field(description="When the check finished.")
    fingerprint: str = Field(
        description="The domain's membership fingerprint checked: its idle verified nodes and "
        "their hardware fingerprints."
    )
    nodeFingerprint: str = Field(
        default="", description="This node's hardware fingerprint when it was checked."
    )
    nodes: list[str] = Field(default_factory=list, description="The nodes the check spanned.")
    thresholdGBs: float | None = Field(
        default=None, description="The per-pair floor held (GB/s), the device class's."
    )
    minGBs: float | None = Field(default=None, description="The lowest cross-tray pair (GB/s).")
    worst: str | None = Field(default=None, description="That pair, `node/GPU <- node/GPU`.")
    measuredLoss: MeasuredLoss | None = Field(
        default=None,
        description="With the controller's --fabric-check-loss: the in-domain and split "
        "all-reduce run after this check passed.",
    )


def record_of(node: dict[str, Any]) -> FabricCheckRecord | None:
    """The node's fabric-check record, None when it has none or an unreadable one (an
    unreadable record is as good as none: the check runs again)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(labels.FABRIC_CHECK)
    if not raw:
        return None
    try:
        return FabricCheckRecord.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None


def dump(record: FabricCheckRecord) -> str:
    return json.dumps(record.model_dump(mode="json", exclude_none=True), sort_keys=True)
