"""The AMD backend: the files the amdgpu driver writes into its PCI function's folder, the KFD
topology (discovery/amd.py), and AMD SMI only where the library is importable (never required:
it fills only what the files did not answer; the sysfs path is what runs without it).

The files, as the kernel documents them (Documentation/gpu/amdgpu/):
- `unique_id` (driver-misc.rst, "unique_id": a unique ID for the GPU that persists from machine
  to machine; GFX9 and newer; 16 hex digits): published as `uuid`. Where the file is missing or
  does not hold a serial, the KFD node's `unique_id` property (the same serial in decimal,
  drivers/gpu/drm/amd/amdkfd/kfd_topology.c) is the second source.
- `mem_info_vram_total` (driver-misc.rst, "GPU Memory Usage Information": the total VRAM, in
  bytes): `memoryMiB`, and the `memory` capacity.
- `product_name`, `product_number` (driver-misc.rst, "GPU Product Information": read from the
  board's FRU EEPROM, on certain server cards only): `productName`; the part number is kept in
  the readings (no attribute carries it).
- `ras/<block>_err_count` (ras.rst, "RAS Error Count sysfs Interface": one line per kind,
  `ue: N` uncorrectable, `ce: N` corrected, and for UMC `de: N` deferred): health, judged in
  health.py (`amd_health`).
- KFD `hive_id` (the XGMI hive, AMD's scale-up fabric) and the XGMI io_links: the fabric.

Every file may be missing (older kernels, consumer cards, RAS off) or unreadable; either way the
fact is None here, so it is absent from the record and health says Unknown, never 0 or Healthy.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fabricdra.api.inventory import Fabric

from ..amd import KfdReadings, read_kfd
from ..sysfs import Absent, SysfsTree, Unreadable
from ..vendors import AMD
from .base import Function, GpuFacts

PCI_DEVICES = "bus/pci/devices"
RAS_SUFFIX = "_err_count"
MIB = 1024 * 1024

_SERIAL = re.compile(r"^(?:0x)?([0-9a-f]{1,16})$")
_COUNT = re.compile(r"^(ue|ce|de)\s*:\s*(\d+)$")


@dataclass(frozen=True, slots=True)
class RasCounts:
    """One RAS block's error counts since the driver loaded."""

    ue: int  # uncorrectable
    ce: int | None = None  # corrected
    de: int | None = None  # deferred (UMC only)


@dataclass(frozen=True, slots=True)
class AmdGpuReading:
    """The amdgpu driver's answers for one GPU; None where the file gave none."""

    unique_id: str | None = None  # 16 lowercase hex digits
    vram_bytes: int | None = None
    product_name: str | None = None
    product_number: str | None = None
    # Per RAS block (`umc`, `gfx`, ...): its counts, or None when its file could not be read as
    # counts. `ras` None: no `ras/` folder could be listed (`ras_problem` says why).
    ras: dict[str, RasCounts | None] | None = None
    ras_problem: str | None = None


@dataclass(frozen=True, slots=True)
class AmdSmiGpu:
    """AMD SMI's answers for one GPU (only what fills a gap in the files)."""

    vram_bytes: int | None = None
    market_name: str | None = None


@dataclass(frozen=True, slots=True)
class AmdReadings:
    kfd: KfdReadings
    gpus: dict[str, AmdGpuReading] = field(default_factory=dict)
    smi: dict[str, AmdSmiGpu] = field(default_factory=dict)
    smi_reason: str | None = None  # why AMD SMI gave nothing (not importable, init failed)


@functools.cache
def importable_amdsmi() -> ModuleType | str:
    """The AMD SMI module, or why there is none (looked up once per process)."""
    try:
        import amdsmi  # type: ignore[import-not-found, unused-ignore]
    except Exception as e:  # not installed, or its shared library will not load
        return f"amdsmi not importable: {e}"
    module: ModuleType = amdsmi
    return module


class AmdBackend:
    """`amdsmi`: the AMD SMI module to ask; None asks the one importable here, if any.
    `ask_amdsmi` False: the files and KFD only."""

    vendor_id = AMD

    def __init__(self, amdsmi: Any = None, *, ask_amdsmi: bool = True) -> None:
        self._amdsmi = amdsmi
        self._ask = ask_amdsmi

    def read(self, tree: SysfsTree, functions: Sequence[Function]) -> AmdReadings:
        gpus = {f.bus_id: read_amdgpu(tree, f.bus_id) for f in functions}
        module: Any = "amdsmi not asked"
        if self._ask:
            module = self._amdsmi if self._amdsmi is not None else importable_amdsmi()
        smi: dict[str, AmdSmiGpu] = {}
        reason: str | None = module if isinstance(module, str) else None
        if reason is None:
            smi, reason = read_amdsmi(module)
        return AmdReadings(kfd=read_kfd(tree), gpus=gpus, smi=smi, smi_reason=reason)

    def facts(self, readings: AmdReadings, bus_id: str) -> GpuFacts | None:
        gpu = readings.gpus.get(bus_id, AmdGpuReading())
        smi = readings.smi.get(bus_id, AmdSmiGpu())
        kfd = readings.kfd.by_bus_id.get(bus_id) if readings.kfd.available else None
        uuid = gpu.unique_id
        if uuid is None and kfd is not None and kfd.unique_id:
            uuid = f"{kfd.unique_id:016x}"
        vram = gpu.vram_bytes if gpu.vram_bytes is not None else smi.vram_bytes
        fabric = None
        if kfd is not None and kfd.hive_id != 0:
            hive = format(kfd.hive_id, "x")
            members = None if kfd.peers is None else kfd.peers + 1
            fabric = Fabric(kind="xgmi", id=hive, memberCount=members, domain=f"xgmi-{hive}")
        return GpuFacts(
            product=gpu.product_name or smi.market_name,
            product_decides_class=False,
            uuid=uuid,
            memory_mib=None if vram is None else vram // MIB,
            fabric=fabric,
        )

    def fabric_known(self, readings: AmdReadings, bus_id: str) -> tuple[bool, bool]:
        kfd = readings.kfd
        if not kfd.available or kfd.unreadable:
            return False, False
        reading = kfd.by_bus_id.get(bus_id)
        members = reading is None or reading.hive_id == 0 or reading.peers is not None
        return True, members


def read_amdgpu(tree: SysfsTree, bus_id: str) -> AmdGpuReading:
    base = f"{PCI_DEVICES}/{bus_id}"
    ras, problem = _read_ras(tree, f"{base}/ras")
    return AmdGpuReading(
        unique_id=_serial(tree.read(f"{base}/unique_id")),
        vram_bytes=_size(tree.read(f"{base}/mem_info_vram_total")),
        product_name=_text(tree.read(f"{base}/product_name")),
        product_number=_text(tree.read(f"{base}/product_number")),
        ras=ras,
        ras_problem=problem,
    )


def _text(value: str | Absent | Unreadable) -> str | None:
    return value if isinstance(value, str) and value else None


def _serial(value: str | Absent | Unreadable) -> str | None:
    m = _SERIAL.match(value.lower()) if isinstance(value, str) else None
    if m is None or int(m.group(1), 16) == 0:
        return None  # an empty file or zeros: the GPU did not say
    return f"{int(m.group(1), 16):016x}"


def _size(value: str | Absent | Unreadable) -> int | None:
    # No VRAM size is 0 or negative: such a file did not answer the question.
    if not isinstance(value, str) or not value.isdigit():
        return None
    return int(value) or None


def _read_ras(
    tree: SysfsTree, folder: str
) -> tuple[dict[str, RasCounts | None] | None, str | None]:
    names = tree.listdir(folder)
    if isinstance(names, Absent):
        return None, "no ras folder (RAS unsupported or disabled)"
    if isinstance(names, Unreadable):
        return None, f"ras folder unreadable: {names}"
    out: dict[str, RasCounts | None] = {}
    for name in sorted(names):
        if name.endswith(RAS_SUFFIX):
            out[name.removesuffix(RAS_SUFFIX)] = _counts(tree.read(f"{folder}/{name}"))
    return out, None


def _counts(value: str | Absent | Unreadable) -> RasCounts | None:
    """`ue: N` / `ce: N` / `de: N` lines; None unless the uncorrectable count is among them."""
    if not isinstance(value, str):
        return None
    seen: dict[str, int] = {}
    for line in value.splitlines():
        m = _COUNT.match(line.strip())
        if m is not None:
            seen[m.group(1)] = int(m.group(2))
    if "ue" not in seen:
        return None
    return RasCounts(ue=seen["ue"], ce=seen.get("ce"), de=seen.get("de"))


def read_amdsmi(amdsmi: Any) -> tuple[dict[str, AmdSmiGpu], str | None]:
    """AMD SMI's VRAM size and market name per GPU, each only where it answers. The library is
    optional: any failure of it is "no answer" (with the reason), never an error of the pass."""
    try:
        amdsmi.amdsmi_init()
    except Exception as e:
        return {}, f"amdsmi_init: {e}"
    out: dict[str, AmdSmiGpu] = {}
    try:
        for handle in amdsmi.amdsmi_get_processor_handles():
            try:
                bus = str(amdsmi.amdsmi_get_gpu_device_bdf(handle)).strip().lower()
            except Exception:
                continue
            out[bus] = AmdSmiGpu(
                vram_bytes=_smi_int(
                    lambda h=handle: amdsmi.amdsmi_get_gpu_memory_total(
                        h, amdsmi.AmdSmiMemoryType.VRAM
                    )
                ),
                market_name=_smi_name(lambda h=handle: amdsmi.amdsmi_get_gpu_asic_info(h)),
            )
    except Exception as e:
        return out, f"amdsmi: {e}"
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()
    return out, None


def _smi_int(call: Any) -> int | None:
    try:
        value = int(call())
    except Exception:
        return None
    return value if value > 0 else None


def _smi_name(call: Any) -> str | None:
    try:
        name = call().get("market_name")
    except Exception:
        return None
    return name.strip() if isinstance(name, str) and name.strip() else None
