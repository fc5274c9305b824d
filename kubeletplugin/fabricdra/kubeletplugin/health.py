"""GPU health for the devices this node offers (seed 003, "Health states").

Unhealthy on what means the GPU cannot be trusted with work:
- uncorrectable ECC errors (cumulative since boot: any is too many);
- a critical Xid error (every Xid except those an application causes itself: 13, 31, 43,
  45, 68, 109 — the NVIDIA device plugin's rule);
- a row-remapping failure, or a remapping pending (the GPU needs a reset to apply it);
- PCIe replays or NVLink errors growing by more than `COUNTER_LIMIT` between two passes
  (the counters are cumulative and a few corrected errors are normal);
- NVML failing to read a GPU it enumerates (e.g. GPU_IS_LOST), or not reporting at all a GPU
  the kernel has bound to the `nvidia` driver while it answers for the others: a GPU that fell
  off the bus is a fault, so it stays published, tainted.
Thermal or power slowdown is *not* unhealthy: the GPU protects itself and recovers, and
flipping health with the load would taint and rewrite the pool on every flip.

Two sources, one answer per GPU keyed by PCI bus id (`0000:1b:00.0`):
- NVML's readings from the discovery pass (`eccUncorrectable`, `rowRemapFailure`,
  `rowRemapPending`, `pcieReplayCounter`, `nvlinkErrors`) and the critical Xids NVML's event
  set delivered (`xidErrors`, filled by `xids.XidWatch`). A GPU that cannot report Xid events
  (`xidEventsSupported` False) is Unknown unless another reading makes it Unhealthy.
- Where a DCGM exporter URL is configured, its metrics `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`
  (uncorrectable volatile ECC), `DCGM_FI_DEV_XID_ERRORS` (the last Xid) and
  `DCGM_FI_DEV_ROW_REMAP_FAILURE`. A problem either source sees counts; GPUs DCGM does not
  report, or a scrape that fails, fall back to NVML.
A GPU neither source can read is `GpuHealth(None)` (Unknown), never healthy by default.

AMD GPUs, from the AMD backend's readings (discovery/backends/amd.py): the amdgpu driver's RAS
error counts per block (`amd_health`): an uncorrectable error in any block is Unhealthy,
corrected errors are not; a count that cannot be read, or no RAS at all, is Unknown.

- a recovery action the driver reports (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, r550+): anything
  but `none` (`recovery-gpu-reset`, `recovery-node-reboot`, `recovery-drain-p2p`, ...);
  resets and reboots are fatal faults (`FATAL_CAUSES` in resourceslices.py).

Each problem also has a short cause token (`GpuHealth.causes`: `ecc`, `xid-<n>`,
`row-remap-failed`, `row-remap-pending`, `pcie-errors`, `nvlink-errors`, `unreadable`, `lost`;
AMD: `ecc`, `ras-<block>`),
what the device taint's value says (resourceslices.taint_value, docs/attributes.md).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import structlog
from prometheus_client.parser import text_string_to_metric_families

from fabricdra.api.inventory import Accelerator

from .devices import APPLICATION_XIDS as _APPLICATION_XIDS
from .devices import GpuHealth
from .discovery.backends.amd import AmdReadings
from .discovery.nvml import NvmlReadings, normalise_bus_id

log = structlog.get_logger("fabricdra.health")

DCGM_ECC = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"
DCGM_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
SCRAPE_TIMEOUT = 2.0

# Xids an application causes (bad address, illegal instruction, ...): not the GPU's fault.
APPLICATION_XIDS = _APPLICATION_XIDS
COUNTER_LIMIT = 100  # PCIe replays / NVLink errors per pass above which a GPU is unhealthy


@dataclass(frozen=True, slots=True)
class DcgmReading:
    ecc_uncorrectable: float | None = None
    xid: float | None = None  # the last Xid (0: none)
    row_remap_failure: float | None = None


@dataclass
class DcgmState:
    """The previous pass's cumulative counters (PCIe replays, NVLink errors) per GPU, to tell
    errors happening now from history."""

    counters: dict[tuple[str, str], int] = field(default_factory=dict)


def gpu_health(
    nvml: NvmlReadings | None,
    dcgm_url: str | None,
    *,
    state: DcgmState | None = None,
    expected: Iterable[str] = (),
    amd: AmdReadings | None = None,
) -> dict[str, GpuHealth]:
    """Health per GPU bus id. `expected`: the bus ids of the GPUs the kernel has bound to the
    nvidia driver, which NVML must report when it answers at all. `amd`: the AMD backend's
    readings (`Discovery.amd`), judged by `amd_health`."""
    out = nvml_health(nvml, state)
    out.update(amd_health(amd))
    if nvml is not None and nvml.available:
        for bus in expected:
            if bus not in out:
                out[bus] = GpuHealth(
                    False, "NVML does not report this GPU (lost, or off the bus)", ("lost",)
                )
    if dcgm_url:
        try:
            readings = parse_dcgm(scrape(dcgm_url))
        except Exception as e:
            log.warning("DCGM exporter scrape failed; using NVML", url=dcgm_url, error=str(e))
        else:
            for bus, reading in dcgm_health(readings).items():
                out[bus] = _merge(out[bus], reading) if bus in out else reading
    return out


def nvidia_bound(accelerators: Iterable[Accelerator] | None) -> list[str]:
    """Bus ids of the GPUs bound to the nvidia kernel driver: the ones NVML must report (a GPU
    on vfio-pci for a VM is not NVML's to see)."""
    return [a.pciBusId for a in accelerators or () if a.driver == "nvidia"]


def keep_unhealthy(
    current: Mapping[str, GpuHealth], last: Mapping[str, GpuHealth]
) -> dict[str, GpuHealth]:
    """`current`, except that a GPU last seen Unhealthy stays Unhealthy while it cannot be
    read: only a reading that says healthy clears it (and with it the device's taint)."""
    out = dict(current)
    for bus, before in last.items():
        now = out.get(bus)
        if before.healthy is False and (now is None or now.healthy is None):
            reason = (before.reason or "unhealthy").removesuffix(_STALE)
            out[bus] = GpuHealth(False, reason + _STALE, before.causes)
    return out


_STALE = " (last reading: the GPU cannot be read now)"


def _merge(a: GpuHealth, b: GpuHealth) -> GpuHealth:
    """Two sources on one GPU: any problem either reports counts; healthy needs one to say so."""
    if a.healthy is False or b.healthy is False:
        reasons = [h.reason for h in (a, b) if h.healthy is False and h.reason]
        causes = [c for h in (a, b) if h.healthy is False for c in h.causes]
        return GpuHealth(
            False, "; ".join(dict.fromkeys(reasons)) or None, tuple(dict.fromkeys(causes))
        )
    if a.healthy or b.healthy:
        return GpuHealth(True)
    return GpuHealth(None, a.reason or b.reason)


def nvml_health(nvml: NvmlReadings | None, state: DcgmState | None = None) -> dict[str, GpuHealth]:
    if nvml is None:
        return {}
    out = {
        bus: GpuHealth(False, f"NVML cannot read this GPU: {reason}", ("unreadable",))
        for bus, reason in nvml.errors.items()
    }
    for bus, gpu in nvml.gpus.items():
        reasons: list[str] = []
        causes: list[str] = []
        if gpu.eccUncorrectable:
            reasons.append(f"uncorrectable ECC errors: {gpu.eccUncorrectable}")
            causes.append("ecc")
        critical = sorted({x for x in gpu.xidErrors or () if x not in APPLICATION_XIDS})
        if critical:
            reasons.append(f"critical Xid errors: {', '.join(map(str, critical))}")
            causes += [f"xid-{x}" for x in critical]
        if gpu.rowRemapFailure:
            reasons.append("row remapping failed")
            causes.append("row-remap-failed")
        if gpu.rowRemapPending:
            reasons.append("row remapping pending (the GPU needs a reset)")
            causes.append("row-remap-pending")
        if gpu.recoveryAction and gpu.recoveryAction != "none":
            # The driver's own verdict on what the GPU needs: any action is a fault.
            reasons.append(f"the driver asks for recovery: {gpu.recoveryAction}")
            causes.append("recovery-" + gpu.recoveryAction.replace("_", "-"))
        for key, what, value in (
            ("pcie", "PCIe replays", gpu.pcieReplayCounter),
            ("nvlink", "NVLink errors", gpu.nvlinkErrors),
        ):
            grew = _growth(state, bus, key, value)
            if grew is not None and grew > COUNTER_LIMIT:
                reasons.append(f"{what}: {grew} since the previous pass")
                causes.append(f"{key}-errors")
        readings = (gpu.eccUncorrectable, gpu.xidErrors, gpu.rowRemapFailure)
        if reasons:
            out[bus] = GpuHealth(False, "; ".join(reasons), tuple(causes))
        elif gpu.xidEventsSupported is False:
            # A critical Xid could happen unseen: not healthy, whatever else reads fine.
            out[bus] = GpuHealth(None, gpu.xidEventsReason or "Xid events not supported")
        elif all(r is None for r in readings):
            out[bus] = GpuHealth(None, "no ECC, Xid or row-remapping reading")
        else:
            out[bus] = GpuHealth(True)
    return out


def _growth(state: DcgmState | None, bus: str, key: str, value: int | None) -> int | None:
    """How much a cumulative counter grew since the previous pass (None: first reading)."""
    if value is None or state is None:
        return None
    before = state.counters.get((bus, key))
    state.counters[(bus, key)] = value
    return None if before is None or value < before else value - before


def amd_health(amd: AmdReadings | None) -> dict[str, GpuHealth]:
    """AMD GPUs from the amdgpu driver's RAS error counts (`ras/<block>_err_count`): any
    uncorrectable error in a block is Unhealthy (cause `ecc` for UMC, the memory controller, as
    NVIDIA's uncorrectable ECC; `ras-<block>` for the others); corrected errors are not (the
    hardware fixed them). Healthy needs every block's counts read: a GPU without RAS, or with a
    count that cannot be read, is Unknown, unless another block already shows a fault."""
    out: dict[str, GpuHealth] = {}
    for bus, gpu in (amd.gpus if amd is not None else {}).items():
        if gpu.ras is None:
            out[bus] = GpuHealth(None, f"no RAS error counts: {gpu.ras_problem}")
            continue
        bad = {block: c.ue for block, c in gpu.ras.items() if c is not None and c.ue > 0}
        unread = [block for block, c in gpu.ras.items() if c is None]
        if bad:
            out[bus] = GpuHealth(
                False,
                "uncorrectable RAS errors: " + ", ".join(f"{b} {n}" for b, n in bad.items()),
                tuple(dict.fromkeys("ecc" if b == "umc" else f"ras-{b}" for b in bad)),
            )
        elif unread:
            out[bus] = GpuHealth(None, f"RAS error counts unreadable: {', '.join(unread)}")
        elif not gpu.ras:
            out[bus] = GpuHealth(None, "no RAS error counts (no <block>_err_count file)")
        else:
            out[bus] = GpuHealth(True)
    return out


def dcgm_health(readings: Mapping[str, DcgmReading]) -> dict[str, GpuHealth]:
    out: dict[str, GpuHealth] = {}
    for bus, r in readings.items():
        reasons: list[str] = []
        causes: list[str] = []
        if r.ecc_uncorrectable:
            reasons.append(f"uncorrectable ECC errors: {int(r.ecc_uncorrectable)}")
            causes.append("ecc")
        if r.xid and int(r.xid) not in APPLICATION_XIDS:
            reasons.append(f"critical Xid errors: {int(r.xid)}")
            causes.append(f"xid-{int(r.xid)}")
        if r.row_remap_failure:
            reasons.append("row remapping failed")
            causes.append("row-remap-failed")
        if reasons:
            out[bus] = GpuHealth(False, "; ".join(reasons), tuple(causes))
        elif r.ecc_uncorrectable is None and r.xid is None and r.row_remap_failure is None:
            out[bus] = GpuHealth(None, "no ECC, Xid or row-remapping reading")
        else:
            out[bus] = GpuHealth(True)
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as resp:
        body: bytes = resp.read(16 * 1024 * 1024)
    return body.decode("utf-8", errors="replace")


def parse_dcgm(text: str) -> dict[str, DcgmReading]:
    """Per-GPU readings from dcgm-exporter's text exposition (label `pci_bus_id`, in NVML's
    `00000000:1B:00.0` form; MIG-level series, labelled `GPU_I_ID`, are skipped)."""
    series: dict[str, dict[str, float]] = {DCGM_ECC: {}, DCGM_XID: {}, DCGM_ROW_REMAP_FAILURE: {}}
    for family in text_string_to_metric_families(text):
        # Match the family: the parser renames a counter's samples to `<name>_total`.
        target = series.get(family.name)
        if target is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") or sample.labels.get("GPU_I_ID"):
                continue
            bus = sample.labels.get("pci_bus_id")
            if bus:
                target[normalise_bus_id(bus)] = float(sample.value)
    ecc, xid, remap = series[DCGM_ECC], series[DCGM_XID], series[DCGM_ROW_REMAP_FAILURE]
    return {
        bus: DcgmReading(ecc.get(bus), xid.get(bus), remap.get(bus))
        for bus in sorted(set(ecc) | set(xid) | set(remap))
    }
