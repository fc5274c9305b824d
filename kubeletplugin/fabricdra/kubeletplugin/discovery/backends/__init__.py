"""The accelerator backends, one per PCI vendor (base.py says what a backend answers).

`registry` is the one place that names them: accelerators.py and node.py ask it, so a vendor's
GPUs get their facts without an `if vendor ==` anywhere else in discovery. A vendor with no
backend (Intel, Habana, ...) is still found by the PCI scan and classed by its PCI id.
"""

from __future__ import annotations

from typing import Any

from ..vendors import AMD, NVIDIA
from .amd import AmdBackend, AmdReadings
from .base import AcceleratorBackend, Function, GpuFacts, MigFacts, VendorPass, run
from .nvidia import NvidiaBackend, NvmlSource, canonical_cluster_uuid

Registry = dict[str, AcceleratorBackend[Any]]


def registry(nvml_source: NvmlSource | None = None, *, ask_amdsmi: bool = True) -> Registry:
    """Every backend, by PCI vendor id. `nvml_source`: how this caller reaches NVML (live or a
    snapshot); None asks no NVML. `ask_amdsmi` False: AMD from the files and KFD only."""
    backends: list[AcceleratorBackend[Any]] = [
        NvidiaBackend(nvml_source),
        AmdBackend(ask_amdsmi=ask_amdsmi),
    ]
    return {b.vendor_id: b for b in backends}


__all__ = [
    "AMD",
    "NVIDIA",
    "AcceleratorBackend",
    "AmdBackend",
    "AmdReadings",
    "Function",
    "GpuFacts",
    "MigFacts",
    "NvidiaBackend",
    "NvmlSource",
    "Registry",
    "VendorPass",
    "canonical_cluster_uuid",
    "registry",
    "run",
]
