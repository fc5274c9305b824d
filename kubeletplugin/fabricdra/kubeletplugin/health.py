"""GPU health for the devices this node offers (seed 003, "Health states"): unhealthy on
uncorrectable ECC errors (cumulative since boot: any is too many) or active thermal throttling.

Two sources, one answer per GPU keyed by PCI bus id (`0000:1b:00.0`):
- NVML's readings from the discovery pass (`eccUncorrectable`, `thermalViolation`).
- Where a DCGM exporter URL is configured, its metrics `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`
  (uncorrectable volatile ECC) and `DCGM_FI_DEV_THERMAL_VIOLATION` (a cumulative counter of
  throttled time: throttling is *active* when it grew since the previous scrape, so the first
  scrape judges ECC only). DCGM wins for the GPUs it reports; GPUs it does not report, or a
  scrape that fails, fall back to NVML.
A GPU neither source can read is `GpuHealth(None)` (Unknown), never healthy by default.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog
from prometheus_client.parser import text_string_to_metric_families

from .devices import GpuHealth
from .discovery.nvml import NvmlReadings, normalise_bus_id

log = structlog.get_logger("fabricdra.health")

DCGM_ECC = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_THERMAL = "DCGM_FI_DEV_THERMAL_VIOLATION"
SCRAPE_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class DcgmReading:
    ecc_uncorrectable: float | None = None
    thermal_violation: float | None = None  # cumulative counter


@dataclass
class DcgmState:
    """The previous scrape's thermal counters, to tell active throttling from history."""

    thermal: dict[str, float] = field(default_factory=dict)


def gpu_health(
    nvml: NvmlReadings | None, dcgm_url: str | None, *, state: DcgmState | None = None
) -> dict[str, GpuHealth]:
    out = nvml_health(nvml)
    if dcgm_url:
        try:
            readings = parse_dcgm(scrape(dcgm_url))
        except Exception as e:
            log.warning("DCGM exporter scrape failed; using NVML", url=dcgm_url, error=str(e))
        else:
            for bus, reading in dcgm_health(readings, state).items():
                out[bus] = _merge(out[bus], reading) if bus in out else reading
    return out


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
            out[bus] = GpuHealth(False, reason + _STALE)
    return out


_STALE = " (last reading: the GPU cannot be read now)"


def _merge(a: GpuHealth, b: GpuHealth) -> GpuHealth:
    """Two sources on one GPU: any problem either reports counts; healthy needs one to say so."""
    if a.healthy is False or b.healthy is False:
        reasons = [h.reason for h in (a, b) if h.healthy is False and h.reason]
        return GpuHealth(False, "; ".join(dict.fromkeys(reasons)) or None)
    if a.healthy or b.healthy:
        return GpuHealth(True)
    return GpuHealth(None, a.reason or b.reason)


def nvml_health(nvml: NvmlReadings | None) -> dict[str, GpuHealth]:
    if nvml is None:
        return {}
    out = {bus: GpuHealth(None, reason) for bus, reason in nvml.errors.items()}
    for bus, gpu in nvml.gpus.items():
        out[bus] = _judge(gpu.eccUncorrectable, gpu.thermalViolation)
    return out


def dcgm_health(
    readings: Mapping[str, DcgmReading], state: DcgmState | None = None
) -> dict[str, GpuHealth]:
    out: dict[str, GpuHealth] = {}
    for bus, r in readings.items():
        throttling: bool | None = None
        if r.thermal_violation is not None and state is not None:
            before = state.thermal.get(bus)
            if before is not None:
                throttling = r.thermal_violation > before
            state.thermal[bus] = r.thermal_violation
        ecc = None if r.ecc_uncorrectable is None else int(r.ecc_uncorrectable)
        out[bus] = _judge(ecc, throttling)
    return out


def _judge(ecc: int | None, throttling: bool | None) -> GpuHealth:
    reasons = []
    if ecc:
        reasons.append(f"uncorrectable ECC errors: {ecc}")
    if throttling:
        reasons.append("thermal throttling active")
    if reasons:
        return GpuHealth(False, "; ".join(reasons))
    if ecc is None and throttling is None:
        return GpuHealth(None, "no ECC or thermal reading")
    return GpuHealth(True)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as resp:
        body: bytes = resp.read(16 * 1024 * 1024)
    return body.decode("utf-8", errors="replace")


def parse_dcgm(text: str) -> dict[str, DcgmReading]:
    """Per-GPU readings from dcgm-exporter's text exposition (label `pci_bus_id`, in NVML's
    `00000000:1B:00.0` form; MIG-level series, labelled `GPU_I_ID`, are skipped)."""
    ecc: dict[str, float] = {}
    thermal: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        # Match the family: the parser renames a counter's samples to `<name>_total`.
        if family.name not in (DCGM_ECC, DCGM_THERMAL):
            continue
        target = ecc if family.name == DCGM_ECC else thermal
        for sample in family.samples:
            if sample.name.endswith("_created") or sample.labels.get("GPU_I_ID"):
                continue
            bus = sample.labels.get("pci_bus_id")
            if bus:
                target[normalise_bus_id(bus)] = float(sample.value)
    return {
        bus: DcgmReading(ecc.get(bus), thermal.get(bus)) for bus in sorted(set(ecc) | set(thermal))
    }
