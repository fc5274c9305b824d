"""Verified discovery: what a verification run expects (data) and what it recorded (status).

Discovery says what a node has; verification says it works. A run executes named probes
(`ProbeName`) against every GPU and RDMA NIC and compares each reading with the expected value
for the device's class, kept as data in `verification.json` (adding hardware is a row there,
not code). The run's outcome is recorded in the node's `NodeDevices` status
(`status.verification`) and decides whether the node's devices are offered for scheduling
(docs/verification.md).

Probe outcomes are honest: a probe that could not run (the tool is not installed, the reading is
absent) is `NotRun`, never `Passed`, and a node passes only when no probe failed and every
probe its device classes require ran and passed.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ProbeName = Literal[
    "inventory",
    "pcie-link",
    "rdma-port",
    "rdma-errors",
    "nvlink",
    "gpu-bandwidth",
    "host-bandwidth",
    "nccl-allreduce",
    "nic-bandwidth",
]
PROBES: tuple[ProbeName, ...] = (
    "inventory",
    "pcie-link",
    "rdma-port",
    "rdma-errors",
    "nvlink",
    "gpu-bandwidth",
    "host-bandwidth",
    "nccl-allreduce",
    "nic-bandwidth",
)
# The probes that run tools (docs/verification.md, "Active probes"): only on an idle node.
ACTIVE_PROBES: tuple[ProbeName, ...] = (
    "gpu-bandwidth",
    "host-bandwidth",
    "nccl-allreduce",
    "nic-bandwidth",
)
# Skipped: the device is excluded from this run for a stated reason (a NIC whose link is down:
# health already taints it); it neither passes nor fails the node.
Outcome = Literal["Passed", "Failed", "NotRun", "Skipped"]
# Verified: the last run passed on the hardware the node has now.  Unverified: no run yet, or
# the hardware/driver changed since the last one (a repair).  Failed: the last run failed.
# Overridden: an operator marked the node verified by hand (recorded as such).
GateState = Literal["Verified", "Unverified", "Failed", "Overridden"]

GPU_DEFAULT = "gpu-default"
RDMA_CLASS = "rdma"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PcieExpectation(_Frozen):
    width: int = Field(description="Minimum link width (lanes) the device must train at.")
    speedGTs: float = Field(description="Minimum link speed in GT/s.")


class ClassExpectation(_Frozen):
    """The expected values for one device class (a GPU class, `gpu-default`, or `rdma`)."""

    name: str = Field(alias="class")
    required: list[ProbeName]
    pcie: PcieExpectation | None = None
    nvlinkActiveLinks: int | None = None
    gpuBandwidthGBs: float | None = None
    rdmaRateGbps: int | None = None
    # counter -> the most it may rise over one window (between two readings; see
    # docs/verification.md): counters are cumulative since the driver loaded, so only a rise
    # says the link is erring now.
    rdmaErrorCounters: dict[str, int] = Field(default_factory=dict)
    nicBandwidthGbps: float | None = None
    # nvbandwidth host_to_device_memcpy_ce: every GPU's copy from host memory (GB/s).
    hostBandwidthGBs: float | None = None
    # nccl-tests all_reduce_perf on every GPU of the node: the bus bandwidth (GB/s).
    ncclAllReduceBusGBs: float | None = None
    # The NIC loopback's minimum as a share of the port's own rate (0.9: 360 of 400 Gb/s).
    nicBandwidthFraction: float | None = None
    # field -> where its figure comes from (docs/verification.md lists them too).
    sources: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Expectations(_Frozen):
    classes: list[ClassExpectation]

    model_config = ConfigDict(frozen=True, extra="ignore")

    def for_gpu(self, device_class: str | None) -> ClassExpectation:
        """A GPU's row: its class's, else `gpu-default` (an unknown class is still probed)."""
        by_name = {c.name: c for c in self.classes}
        return by_name.get(device_class or "", by_name[GPU_DEFAULT])

    def for_nic(self) -> ClassExpectation:
        return next(c for c in self.classes if c.name == RDMA_CLASS)


@cache
def load_expectations() -> Expectations:
    text = resources.files("fabricdra.api").joinpath("verification.json").read_text()
    return parse_expectations(text)


def parse_expectations(text: str) -> Expectations:
    """Parse an expectations document; a missing `gpu-default` or `rdma` row is an error."""
    table = Expectations.model_validate(json.loads(text))
    names = {c.name for c in table.classes}
    for needed in (GPU_DEFAULT, RDMA_CLASS):
        if needed not in names:
            raise ValueError(f"verification expectations: no {needed!r} row")
    return table


# --- what a system model promises (systems.json, or an operator's --expect file) -----------


class GpuInventory(_Frozen):
    count: int = Field(description="How many GPUs the system has.")
    deviceClass: str | None = Field(
        default=None,
        description="Their canonical class (deviceclasses.json); None: any GPU counts.",
    )
    product: str | None = Field(default=None, description="The product, in words.")


class HcaInventory(_Frozen):
    count: int | None = Field(default=None, description="Compute HCAs (RDMA PFs); None: not held.")
    linkLayer: Literal["InfiniBand", "Ethernet"] | None = Field(
        default=None, description="The link layer every compute HCA port must show."
    )
    rateGbps: int | None = Field(
        default=None, description="The rate every compute HCA port must reach (Gb/s)."
    )
    nextToGpu: bool = Field(
        default=False,
        description="Compute HCAs are the RDMA NICs that share a PCIe switch with a GPU (the "
        "8-GPU baseboards); false: every RDMA NIC of the node.",
    )


class SystemProfile(_Frozen):
    """The hardware a system model is sold with: what `inventory` and the compute HCAs' rate
    are held to."""

    name: str
    match: list[str] = Field(
        default_factory=list,
        description="DMI product or board names (compared ignoring case, spaces, - and _).",
    )
    gpus: GpuInventory | None = None
    hcas: HcaInventory | None = None
    sources: list[str] = Field(default_factory=list, description="Where each figure comes from.")


class _Profiles(_Frozen):
    systems: list[SystemProfile]

    model_config = ConfigDict(frozen=True, extra="ignore")


@cache
def load_profiles() -> tuple[SystemProfile, ...]:
    text = resources.files("fabricdra.api").joinpath("systems.json").read_text()
    return tuple(_Profiles.model_validate(json.loads(text)).systems)


def parse_profile(text: str) -> SystemProfile:
    """An operator's profile (`--expect`, chart `verification.expect`), YAML or JSON; `name`
    defaults to "expected"."""
    import yaml

    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise ValueError("a system profile is a mapping (name, gpus, hcas)")
    return SystemProfile.model_validate({"name": "expected", **doc})


def model_key(text: str) -> str:
    """'NVIDIA DGX-H100 ' -> 'nvidiadgxh100': vendors spell one model several ways."""
    return re.sub(r"[\s_\-]+", "", text).lower()


def profile_for(
    names: list[str], profiles: tuple[SystemProfile, ...] | None = None
) -> SystemProfile | None:
    """The profile whose longest `match` occurs in one of the DMI names (product, board)."""
    keys = [model_key(n) for n in names if n and n.strip()]
    best: tuple[int, SystemProfile] | None = None
    for profile in load_profiles() if profiles is None else profiles:
        for pattern in profile.match:
            k = model_key(pattern)
            if k and any(k in key for key in keys) and (best is None or len(k) > best[0]):
                best = (len(k), profile)
    return best[1] if best else None


# --- what a run recorded (NodeDevices status.verification) ---------------------------------


class ProbeResult(_Frozen):
    probe: ProbeName
    device: str = Field(description="What was probed: a PCI bus id, an RDMA device, or `node`.")
    deviceClass: str = Field(description="The class whose expected values applied.")
    outcome: Outcome
    measured: str | None = Field(default=None, description="The reading, as read.")
    expected: str | None = Field(default=None, description="The expected value it was held to.")
    reason: str | None = Field(default=None, description="Why it failed or did not run.")


class Override(_Frozen):
    """A manual override, as `fabricdra verify --override` writes it into the Node annotation.

    It holds only for the hardware it was given for (`fingerprint`, the node's
    `currentFingerprint` when it was given) and only until `expires`: one without either is
    not applied (docs/verification.md)."""

    reason: str
    by: str | None = None
    time: datetime | None = None
    fingerprint: str | None = Field(
        default=None, description="The node's hardware and driver identity it was given for."
    )
    expires: datetime | None = Field(default=None, description="When it stops applying.")


class Verification(_Frozen):
    """One node's verification record: the last run and the gate state it gives."""

    state: GateState
    reason: str = Field(description="Why the node is in this state, in words.")
    time: datetime | None = Field(default=None, description="When the last run finished.")
    fingerprint: str | None = Field(
        default=None,
        description="The hardware and driver identity the last run saw; a different one now "
        "means a repair or driver change, and the node is unverified again.",
    )
    passed: bool | None = Field(default=None, description="Whether the last run passed.")
    probes: list[ProbeResult] = Field(default_factory=list)
    override: Override | None = Field(default=None, description="The override applied, if any.")
    currentFingerprint: str | None = Field(
        default=None,
        description="The hardware and driver identity the node has now (what an override is "
        "given for; differs from `fingerprint` while a run on new hardware is pending).",
    )
    overrideIgnored: str | None = Field(
        default=None,
        description="Why the node's override annotation is not applied (given for other "
        "hardware, expired, or not bound to any), in words.",
    )

    @property
    def offered(self) -> bool:
        """Whether the node's devices are offered for scheduling."""
        return self.state in ("Verified", "Overridden")
