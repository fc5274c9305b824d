"""The device kinds this driver offers, in order (docs/adding-a-device-kind.md).

Adding a kind: a module here with a `KIND` subclassing `base.DeviceKind`, one entry in
`KINDS`, a DeviceClass row, a docs/attributes.md row; tests/unit/test_kind_conformance.py
then checks it. The compute-domain driver's `channel` and `daemon` devices are not kinds of
this driver (another driver, compute-domain.fabricdra.io): computedomain/ builds them.
"""

from __future__ import annotations

from ..devices import Device
from . import accelerator, amd_gpu, efa, gaudi, nvidia_gpu, nvidia_mig, rdma
from .base import BuildInputs, ClaimGroup, DeviceKind, PrepareContext, Served

KINDS: tuple[DeviceKind, ...] = (
    nvidia_gpu.KIND,
    nvidia_mig.KIND,
    amd_gpu.KIND,
    rdma.KIND,
    efa.KIND,
    gaudi.KIND,
)

# The claim-level CDI devices, in the order a claim's spec lists them.
CLAIM_GROUPS: tuple[ClaimGroup, ...] = (rdma.NCCL, accelerator.GPUS, efa.LIBFABRIC)


def kind_of(device: Device) -> DeviceKind:
    """The kind a device is one of; LookupError for a device no kind owns (a bug)."""
    for kind in KINDS:
        if kind.owns(device):
            return kind
    raise LookupError(f"device {device.name} (type {device.type}) belongs to no device kind")


__all__ = [
    "CLAIM_GROUPS",
    "KINDS",
    "BuildInputs",
    "ClaimGroup",
    "DeviceKind",
    "PrepareContext",
    "Served",
    "kind_of",
]
