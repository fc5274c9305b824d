"""AMD GPUs through their backend: the serial (`uuid`), VRAM (`memoryMiB`) and FRU product name
from the files the amdgpu driver writes into its PCI function's folder, the serial from the KFD
topology where that file is missing, and health from the RAS error counts; published the way
NVIDIA's are. A file that cannot be read is never published as an answer: the attribute is
absent and health is Unknown (seed: an inability to ask is not an answer of no)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.deviceclasses import load_device_classes
from fabricdra.api.inventory import Accelerator
from fabricdra.kubeletplugin.agent import Agent
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import GpuHealth
from fabricdra.kubeletplugin.discovery import accelerators as accel
from fabricdra.kubeletplugin.discovery.backends import AMD, NVIDIA, registry
from fabricdra.kubeletplugin.discovery.backends.amd import AmdBackend
from fabricdra.kubeletplugin.discovery.backends.nvidia import NvidiaBackend
from fabricdra.kubeletplugin.discovery.node import Discovery
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.health import amd_health, gpu_health
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY, build_slices
from tests.sysfs.builder import UNREADABLE_HOW, SysfsBuilder
from tests.sysfs.nodes import (
    MI300X_GPUS,
    MI300X_HIVE,
    MI300X_PRODUCT,
    MI300X_VRAM_BYTES,
    amd_mi300x,
    discover_at,
    mi300x_unique_id,
)
from tests.unit.agentkit import offline_config

KFD = "devices/virtual/kfd/kfd/topology/nodes"
MI300X_MIB = MI300X_VRAM_BYTES // (1024 * 1024)  # 196592


@pytest.fixture
def b(tmp_path: Path) -> SysfsBuilder:
    return SysfsBuilder(tmp_path / "sys")


def _discover(b: SysfsBuilder) -> Discovery:
    return discover_at(b.root)


def _accs(b: SysfsBuilder) -> dict[str, Accelerator]:
    found = _discover(b).accelerators
    assert found is not None
    return {a.pciBusId: a for a in found}


def _fn(bdf: str) -> str:
    return f"bus/pci/devices/{bdf}"


# -- the registry ---------------------------------------------------------------------------


def test_one_backend_per_vendor() -> None:
    backends = registry()
    assert isinstance(backends[NVIDIA], NvidiaBackend)
    assert isinstance(backends[AMD], AmdBackend)
    assert {v.vendor_id for v in backends.values()} == set(backends)


# -- identity -------------------------------------------------------------------------------


def test_mi300x_gpus_carry_serial_memory_and_product(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    accs = _accs(b)
    assert len(node.gpus) == MI300X_GPUS
    for i, bus in enumerate(node.gpus):
        a = accs[bus]
        assert a.uuid == f"{mi300x_unique_id(i):016x}"
        assert a.memoryMiB == MI300X_MIB
        assert a.productName == MI300X_PRODUCT
        assert a.deviceClass == "mi300x-192gb-oam"
        assert a.topology.fabric is not None
        assert a.topology.fabric.domain == f"xgmi-{MI300X_HIVE:x}"  # unchanged


def test_serial_from_kfd_where_the_function_has_no_unique_id(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    (b.root / _fn(node.gpus[0]) / "unique_id").unlink()
    assert _accs(b)[node.gpus[0]].uuid == f"{mi300x_unique_id(0):016x}"


def test_without_the_driver_files_nothing_is_made_up(b: SysfsBuilder) -> None:
    node = amd_mi300x(b)  # KFD without unique_id, no amdgpu files
    for bus in node.gpus:
        a = _accs(b)[bus]
        assert (a.uuid, a.memoryMiB) == (None, None)
        assert a.productName == "AMD Instinct MI300X"  # the class's label, as before
        assert a.deviceClass == "mi300x-192gb-oam"


@pytest.mark.parametrize("how", UNREADABLE_HOW)
def test_unreadable_serial_and_memory_are_absent_never_zero(b: SysfsBuilder, how: str) -> None:
    node = amd_mi300x(b, amdgpu=True)
    gpu = node.gpus[3]
    b.make_unreadable(f"{_fn(gpu)}/unique_id", how)
    b.make_unreadable(f"{_fn(gpu)}/mem_info_vram_total", how)
    # KFD node 5 is GPU 3: without its properties the serial has no second source.
    b.make_unreadable(f"{KFD}/5/properties", how)
    accs = _accs(b)
    assert (accs[gpu].uuid, accs[gpu].memoryMiB) == (None, None)
    other = accs[node.gpus[4]]
    assert (other.uuid, other.memoryMiB) == (f"{mi300x_unique_id(4):016x}", MI300X_MIB)


@pytest.mark.parametrize("text", ["", "lots\n", "0\n", "-5\n"])
def test_a_memory_size_that_is_no_size_is_absent(b: SysfsBuilder, text: str) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[0])}/mem_info_vram_total", text)
    assert _accs(b)[node.gpus[0]].memoryMiB is None


def test_a_serial_that_is_no_serial_falls_to_kfd(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[1])}/unique_id", "not-hex\n")
    assert _accs(b)[node.gpus[1]].uuid == f"{mi300x_unique_id(1):016x}"


def test_an_fru_name_the_table_does_not_know_keeps_the_pci_class(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[0])}/product_name", "OEM Accelerator Board\n")
    a = _accs(b)[node.gpus[0]]
    assert a.productName == "OEM Accelerator Board"
    assert a.deviceClass == "mi300x-192gb-oam"


# -- health ---------------------------------------------------------------------------------


def _health(b: SysfsBuilder) -> dict[str, GpuHealth]:
    d = _discover(b)
    return gpu_health(d.nvml, None, amd=d.amd)


def test_zero_ras_counts_are_healthy(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    health = _health(b)
    assert {bus: health[bus] for bus in node.gpus} == {bus: GpuHealth(True) for bus in node.gpus}


def test_corrected_errors_alone_are_healthy(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[0])}/ras/umc_err_count", "ue: 0\nce: 12\nde: 0\n")
    assert _health(b)[node.gpus[0]] == GpuHealth(True)


def test_uncorrectable_memory_errors_are_unhealthy(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[2])}/ras/umc_err_count", "ue: 3\nce: 0\nde: 0\n")
    b.write(f"{_fn(node.gpus[5])}/ras/gfx_err_count", "ue: 1\nce: 0\n")
    health = _health(b)
    bad = health[node.gpus[2]]
    assert bad.healthy is False
    assert bad.causes == ("ecc",)
    assert bad.reason is not None
    assert "umc 3" in bad.reason
    assert health[node.gpus[5]].healthy is False
    assert health[node.gpus[5]].causes == ("ras-gfx",)
    assert health[node.gpus[0]] == GpuHealth(True)


@pytest.mark.parametrize("how", UNREADABLE_HOW)
def test_an_unreadable_ras_count_is_unknown_not_healthy(b: SysfsBuilder, how: str) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.make_unreadable(f"{_fn(node.gpus[0])}/ras/umc_err_count", how)
    got = _health(b)[node.gpus[0]]
    assert got.healthy is None
    assert got.reason is not None
    assert "umc" in got.reason


@pytest.mark.parametrize("text", ["", "ce: 0\n", "ue: many\nce: 0\n"])
def test_a_ras_count_without_a_number_is_unknown(b: SysfsBuilder, text: str) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[0])}/ras/gfx_err_count", text)
    assert _health(b)[node.gpus[0]].healthy is None


def test_one_unreadable_block_does_not_hide_another_blocks_fault(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.make_unreadable(f"{_fn(node.gpus[0])}/ras/gfx_err_count")
    b.write(f"{_fn(node.gpus[0])}/ras/umc_err_count", "ue: 1\nce: 0\nde: 0\n")
    got = _health(b)[node.gpus[0]]
    assert (got.healthy, got.causes) == (False, ("ecc",))


def test_a_gpu_without_ras_is_unknown(b: SysfsBuilder) -> None:
    node = amd_mi300x(b)  # no ras/ folder: RAS unsupported or off
    health = amd_health(_discover(b).amd)
    for bus in node.gpus:
        assert health[bus].healthy is None


def test_an_unreadable_ras_folder_is_unknown(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.escape(f"{_fn(node.gpus[0])}/ras")
    assert _health(b)[node.gpus[0]].healthy is None


# -- published as NVIDIA's are --------------------------------------------------------------


def _slices(d: Discovery) -> dict[str, dict[str, Any]]:
    assert d.interfaces is not None
    assert d.accelerators is not None
    inv = build_devices(
        d.interfaces, d.accelerators, gpu_health=gpu_health(d.nvml, None, amd=d.amd)
    )
    plan = build_slices(inv, "node-a")
    return {x["name"]: x for s in plan.slices for x in s["spec"].get("devices", [])}


def test_amd_gpus_publish_uuid_memory_and_a_health_taint(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"{_fn(node.gpus[1])}/ras/umc_err_count", "ue: 2\nce: 0\nde: 0\n")
    devs = _slices(_discover(b))
    first = devs["gpu-" + node.gpus[0].replace(":", "-").replace(".", "-")]
    assert first["attributes"]["uuid"] == {"string": f"{mi300x_unique_id(0):016x}"}
    assert first["attributes"]["productName"] == {"string": MI300X_PRODUCT}
    assert first["capacity"] == {"memory": {"value": f"{MI300X_MIB}Mi"}}
    assert "taints" not in first
    bad = devs["gpu-" + node.gpus[1].replace(":", "-").replace(".", "-")]
    assert [(t["key"], t["value"]) for t in bad["taints"]] == [(TAINT_KEY, "gpu-ecc")]


# -- AMD SMI, where importable --------------------------------------------------------------


class _AmdSmi:
    """A stand-in for the `amdsmi` module with its call names and answer shapes (AMD SMI's
    Python API), for hosts without ROCm: it answers for the GPUs it is given."""

    class AmdSmiMemoryType:
        VRAM = 0

    def __init__(self, answers: dict[str, tuple[int, str]], *, init_fails: bool = False) -> None:
        self.answers = answers
        self.init_fails = init_fails
        self.shut = False

    def amdsmi_init(self) -> None:
        if self.init_fails:
            raise RuntimeError("AMDSMI_STATUS_DRIVER_NOT_LOADED")

    def amdsmi_get_processor_handles(self) -> list[str]:
        return list(self.answers)

    def amdsmi_get_gpu_device_bdf(self, handle: str) -> str:
        return handle

    def amdsmi_get_gpu_memory_total(self, handle: str, kind: int) -> int:
        return self.answers[handle][0]

    def amdsmi_get_gpu_asic_info(self, handle: str) -> dict[str, Any]:
        return {"market_name": self.answers[handle][1]}

    def amdsmi_shut_down(self) -> None:
        self.shut = True


def _with_backend(b: SysfsBuilder, backend: AmdBackend) -> dict[str, Accelerator]:
    tree = SysfsTree(b.root)
    try:
        candidates = accel.find_accelerators(tree).candidates
        vendors = accel.read_vendors(tree, candidates, {AMD: backend})
        found = accel.describe_accelerators(tree, candidates, vendors, load_device_classes())
    finally:
        tree.close()
    return {a.pciBusId: a for a in found}


def test_amdsmi_fills_only_what_the_files_did_not_answer(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    (b.root / _fn(node.gpus[0]) / "mem_info_vram_total").unlink()
    (b.root / _fn(node.gpus[0]) / "product_name").unlink()
    smi = _AmdSmi(dict.fromkeys(node.gpus[:2], (MI300X_VRAM_BYTES, "AMD Instinct MI300X")))
    accs = _with_backend(b, AmdBackend(smi))
    assert (accs[node.gpus[0]].memoryMiB, accs[node.gpus[0]].productName) == (
        MI300X_MIB,
        "AMD Instinct MI300X",
    )
    assert accs[node.gpus[1]].productName == MI300X_PRODUCT  # the file's answer stands
    assert smi.shut


def test_amdsmi_that_fails_is_no_answer(b: SysfsBuilder) -> None:
    node = amd_mi300x(b, amdgpu=True)
    (b.root / _fn(node.gpus[0]) / "mem_info_vram_total").unlink()
    backend = AmdBackend(_AmdSmi({}, init_fails=True))
    accs = _with_backend(b, backend)
    assert accs[node.gpus[0]].memoryMiB is None
    assert accs[node.gpus[1]].memoryMiB == MI300X_MIB


# -- the node agent -------------------------------------------------------------------------


class _Captured:
    """The agent's publisher seam (as in test_xid_events.py): nothing is published."""

    def sync(self, discovery: Discovery, devices: Any, verification: Any = None) -> Any:
        return None


def test_the_agent_judges_amd_gpus_each_pass(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    node = amd_mi300x(b, amdgpu=True)
    config = offline_config(tmp_path, tmp_path / "sys")
    agent = Agent(config, None, publisher=_Captured())
    name = "gpu-" + node.gpus[0].replace(":", "-").replace(".", "-")
    umc = f"{_fn(node.gpus[0])}/ras/umc_err_count"

    def health() -> str:
        device = agent.pass_once().get(name)
        assert device is not None
        return device.health

    assert health() == "Healthy"
    b.write(umc, "ue: 1\nce: 0\nde: 0\n")
    assert health() == "Unhealthy"
    b.make_unreadable(umc)
    assert health() == "Unhealthy"  # a failed read never clears a fault
    (b.root / umc).rmdir()  # the file is back
    b.write(umc, "ue: 0\nce: 0\nde: 0\n")
    assert health() == "Healthy"  # only a reading that says healthy does
