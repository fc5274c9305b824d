"""NVIDIA details from NVML, live (nvidia-ml-py) or from a recorded snapshot: the NVIDIA
accelerator backend's source (backends/nvidia.py models them). Split in three: `snapshot` (the
recorded form and its file), `live` (asking the library), `xid` (the event source).

A snapshot is a JSON object keyed by PCI bus id (`0000:1b:00.0`) whose values carry at least
`uuid`, `name`, `memoryTotalMiB`, `migMode` and `fabric {clusterUuid, cliqueId, state, status}`,
with state/status in NVML's words. Optional, where NVML offers them: the identity users select
on (`driverVersion`, `cudaDriverVersion` as NVML's integer, e.g. 12040, `cudaComputeCapability`
"9.0", `architecture`, `brand`, `addressingMode` `HMM`/`ATS`/`None`), `memoryNumaNodes` (Grace:
the NUMA nodes of the GPU's own memory), per-MIG-instance compute capacities (`multiprocessors`,
`copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`) and GPU instance placement
(`placementStart`, the first memory slice: what dynamic MIG adopts it at), health inputs
(`eccUncorrectable`, `xidErrors` seen, `rowRemapFailure`, `rowRemapPending`,
`pcieReplayCounter`, `nvlinkErrors`; `thermalViolation` is recorded but judges nothing) and
the NVLink links (`nvlinks`: state, and for an active link the remote end's PCI bus id and
type, GPU or NVSwitch, from which discovery/nvlink.py groups the GPUs that reach each other).
`fabricdra nvml-snapshot` records one on a GPU host, so
hosts without GPUs (CI, laptops) can replay a real machine's answers.

Xid errors are NVML *events*, not readings: `LiveXidEvents` holds one event set open (the
node agent keeps it for its life) and drains it without blocking; `ReplayedXidEvents` plays
back what a snapshot recorded (`xidEventsSupported`, `xidEventsReason`, and `xidEvents`, in
the order they arrived, each delivered once; a test appends to the file to make one arrive).
Both answer the same two questions, so the consumer (`kubeletplugin/xids.py`) is the same code
on hardware and off it.
"""

from __future__ import annotations

from .live import _read_fabric, read_live, status_name
from .snapshot import (
    FabricState,
    NvLinkRemote,
    NvmlReadings,
    SnapshotError,
    SnapshotFabric,
    SnapshotGpu,
    SnapshotMigDevice,
    SnapshotNvLink,
    SnapshotXidEvent,
    dump_snapshot,
    load_snapshot,
    normalise_bus_id,
)
from .xid import (
    MAX_EVENTS_PER_DRAIN,
    LiveXidEvents,
    ReplayedXidEvents,
    XidEvent,
    XidEventsError,
    XidEventSource,
    record_xid_events,
)

__all__ = [
    "MAX_EVENTS_PER_DRAIN",
    "FabricState",
    "LiveXidEvents",
    "NvLinkRemote",
    "NvmlReadings",
    "ReplayedXidEvents",
    "SnapshotError",
    "SnapshotFabric",
    "SnapshotGpu",
    "SnapshotMigDevice",
    "SnapshotNvLink",
    "SnapshotXidEvent",
    "XidEvent",
    "XidEventSource",
    "XidEventsError",
    "_read_fabric",
    "dump_snapshot",
    "load_snapshot",
    "normalise_bus_id",
    "read_live",
    "record_xid_events",
    "status_name",
]
