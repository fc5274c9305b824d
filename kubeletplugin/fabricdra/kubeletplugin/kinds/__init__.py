"""The device kinds this driver offers, in order (docs/adding-a-device-kind.md).

Adding a kind: a module here with a `KIND` subclassing `base.DeviceKind`, one entry in
`KINDS`, a DeviceClass row, a docs/attributes.md row; tests/unit/test_kind_conformance.py
then checks it. The compute-domain driver's `channel` and `daemon` devices are not kinds of
this driver (another driver, compute-domain.fabricdra.io): computedomain/ builds them.
"""

from __future__ import annotations

from pathlib import Path

from ..devices import Device
from . import accelerator, amd_gpu, efa, gaudi, nvidia_gpu, nvidia_mig, rdma
from .base import BuildInputs, ClaimGroup, DeviceKind, PrepareContext, Served
from .family import PodEnv
from .rdma.holds import held_devices, held_endpoints, pins_mode
from .rdma.podenv import NcclPodEnv, PodReader

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


def _nccl_hca(device: Device) -> str | None:
    return kind_of(device).nccl_hca(device)


def pod_envs(pods: PodReader | None, nccl_topo_dir: Path | None) -> tuple[PodEnv, ...]:
    """Each family's part in the environment a pod shares across its claims, in the order
    prepare calls them (RDMA: NCCL's pod-wide HCA list and NCCL_TOPO_FILE)."""
    return (NcclPodEnv(pods, nccl_topo_dir, _nccl_hca),)


__all__ = [
    "CLAIM_GROUPS",
    "KINDS",
    "BuildInputs",
    "ClaimGroup",
    "DeviceKind",
    "PodReader",
    "PrepareContext",
    "Served",
    "held_devices",
    "held_endpoints",
    "kind_of",
    "pins_mode",
    "pod_envs",
]
