"""A reusable kubelet DRA plugin: registration, DRA v1/v1beta1, health, CDI and checkpoint.

Public surface (import from `fabricdra.kubeletplugin.kubelet`):

- `DraDriver` (protocol): `driver_name`, `prepare(ClaimRef) -> Sequence[PreparedDevice]`,
  `unprepare(ClaimRef) -> None`; `ClaimRef`, `PreparedDevice`, `DeviceHealth`,
  `PrepareError`; `current_call()` (the kubelet call being served: deadline, still active)
  — see `driver.py`.
- `PluginServer(driver, PluginPaths.for_driver(name, registry_dir=..., plugin_dir=...),
  health=HealthBroadcaster())`: `start()`, `stop()`, context manager; `registered` is an
  Event set when kubelet confirms the registration; `metrics=ClaimMetrics(...)` records
  each claim's prepare/unprepare time and failures into the caller's collectors — see
  `server.py`.
- `HealthBroadcaster.publish([DeviceHealth...])`: feeds kubelet's health stream — see
  `healthstream.py`.
- `cdi`: CDI spec model, lowest cdiVersion, atomic writes (`CdiWriter`) — see `cdi.py`.
- `checkpoint`: per-claim records, written atomically, that survive restarts
  (`Checkpoint`) — see `checkpoint.py`.
- `claims`: the safety rules every driver's prepare follows (API reads before any lock,
  within `api_timeout()`; `read_claim`, `wait_until`, `ensure_wanted`; spec removal confined
  to the CDI folder; the sweep that reports, never frees, claims gone from the API) — see
  `claims.py`.

Nothing here knows about a particular driver's devices: `fabricdra.kubeletplugin.prepare`
(devices.fabricdra.io) and the ComputeDomain driver both plug into it.
"""

from .claims import (
    DEADLINE_MARGIN,
    READ_BUDGET,
    ClaimReader,
    ClaimSweeper,
    RestClaimReader,
    api_timeout,
    ensure_wanted,
    read_claim,
    wait_until,
)
from .driver import (
    KUBELET_DEADLINE,
    Call,
    ClaimRef,
    DeviceHealth,
    DraDriver,
    Health,
    PreparedDevice,
    PrepareError,
    current_call,
)
from .healthstream import HealthBroadcaster
from .server import (
    DRA_V1_SERVICE,
    DRA_V1BETA1_SERVICE,
    HEALTH_V1ALPHA1_SERVICE,
    PLUGIN_TYPE,
    ClaimMetrics,
    PluginPaths,
    PluginServer,
    PluginServerError,
    RegistrationStatus,
)

__all__ = [
    "DEADLINE_MARGIN",
    "DRA_V1BETA1_SERVICE",
    "DRA_V1_SERVICE",
    "HEALTH_V1ALPHA1_SERVICE",
    "KUBELET_DEADLINE",
    "PLUGIN_TYPE",
    "READ_BUDGET",
    "Call",
    "ClaimMetrics",
    "ClaimReader",
    "ClaimRef",
    "ClaimSweeper",
    "DeviceHealth",
    "DraDriver",
    "Health",
    "HealthBroadcaster",
    "PluginPaths",
    "PluginServer",
    "PluginServerError",
    "PrepareError",
    "PreparedDevice",
    "RegistrationStatus",
    "RestClaimReader",
    "api_timeout",
    "current_call",
    "ensure_wanted",
    "read_claim",
    "wait_until",
]
