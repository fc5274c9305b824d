"""The probes of a verification run: discovery records + sysfs + NVML in, `ProbeResult`s out.

Each probe reads one thing and compares it with the expected value of the device's class
(`fabricdra.api.verification`, data). A reading that could not be taken is `NotRun` with the
reason — never `Passed` and never silently dropped. Which devices are probed:

* every accelerator: `pcie-link`; NVIDIA GPUs also `nvlink` where their class expects NVLink;
* every RDMA-capable physical NIC: `pcie-link`, `rdma-port`, `rdma-errors`, `nic-bandwidth`.
  VFs share their PF's link and are not probed separately. A NIC whose link verdict is Failed
  is `Skipped`: it is down, health already taints it, and verification measures working links;
* the node, once: `gpu-bandwidth` when it has NVIDIA GPUs.

PCIe rule: width must equal `max_link_width` (a device trained on fewer lanes is degraded) and
both must reach the class's minimum. Speed: a NIC's `current_link_speed` must equal its
`max_link_speed`; a GPU's current speed is recorded but not compared, because NVIDIA GPUs drop
the link to a lower generation when idle — its `max_link_speed` must reach the class minimum,
and a link stuck at a low speed shows up in the bandwidth probe.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from fabricdra.api.inventory import Accelerator, Interface
from fabricdra.api.verification import (
    ClassExpectation,
    Expectations,
    Outcome,
    ProbeName,
    ProbeResult,
)

from ..discovery.nvml import NvmlReadings
from ..discovery.sysfs import SysfsTree
from . import tools as bandwidth


@dataclass(frozen=True)
class Tools:
    """Where the bandwidth tools are looked up, and how long one may run."""

    path: str | None = None  # a PATH-style search list; None: the process's PATH
    timeout_seconds: float = 300.0
    run_bandwidth: bool = True  # False: bandwidth probes are NotRun ("disabled")


def run_probes(
    tree: SysfsTree,
    interfaces: list[Interface],
    accelerators: list[Accelerator],
    nvml: NvmlReadings | None,
    expectations: Expectations,
    tools: Tools = Tools(),  # frozen: a shared default is safe
) -> list[ProbeResult]:
    results: list[ProbeResult] = []
    nvidia: list[tuple[Accelerator, ClassExpectation]] = []
    for acc in sorted(accelerators, key=lambda a: a.pciBusId):
        row = expectations.for_gpu(acc.deviceClass)
        results.append(pcie_link(tree, acc.pciBusId, row, gpu=True))
        if acc.vendor == "nvidia":
            nvidia.append((acc, row))
            if row.nvlinkActiveLinks is not None or "nvlink" in row.required:
                results.append(nvlink(acc, row, nvml))
    nic_row = expectations.for_nic()
    nics = [i for i in sorted(interfaces, key=lambda i: i.name) if i.rdma and i.rdmaDevice]
    for index, nic in enumerate(nics):
        results.extend(_nic(tree, nic, nic_row, tools, index))
    if nvidia:
        results.append(gpu_bandwidth([a for a, _ in nvidia], [r for _, r in nvidia], tools))
    return results


# --- PCIe ---------------------------------------------------------------------------------


def _reporter(
    probe: ProbeName, device: str, row: ClassExpectation, expected: str
) -> Callable[..., ProbeResult]:
    """A probe's result maker: what varies between its outcomes is the outcome, what was
    measured and why."""

    def result(
        outcome: Outcome, measured: str | None = None, reason: str | None = None
    ) -> ProbeResult:
        return ProbeResult(
            probe=probe,
            device=device,
            deviceClass=row.name,
            outcome=outcome,
            measured=measured,
            expected=expected,
            reason=reason,
        )

    return result


def _gts(speed: str) -> float | None:
    """'32.0 GT/s PCIe' (or older kernels' '8 GT/s') -> 32.0; 'Unknown' -> None."""
    m = re.match(r"\s*([0-9.]+)\s*GT/s", speed)
    return float(m.group(1)) if m else None


def pcie_link(
    tree: SysfsTree, bus_id: str | None, row: ClassExpectation, *, gpu: bool
) -> ProbeResult:
    device = bus_id or "unknown"

    def result(
        outcome: Outcome, measured: str | None, expected: str, reason: str | None = None
    ) -> ProbeResult:
        return ProbeResult(
            probe="pcie-link",
            device=device,
            deviceClass=row.name,
            outcome=outcome,
            measured=measured,
            expected=expected,
            reason=reason,
        )

    minimum = f" and at least x{row.pcie.width} {row.pcie.speedGTs:g} GT/s" if row.pcie else ""
    expected = ("width = max_link_width" if gpu else "width and speed = max_*") + minimum
    if bus_id is None:
        return result("NotRun", None, expected, "no PCI bus id")
    base = f"bus/pci/devices/{bus_id}"
    readings = {}
    for name in ("current_link_width", "max_link_width", "current_link_speed", "max_link_speed"):
        value = tree.read(f"{base}/{name}")
        if not isinstance(value, str):
            return result("NotRun", None, expected, str(value))
        readings[name] = value
    measured = (
        f"x{readings['current_link_width']} {readings['current_link_speed']} "
        f"(max x{readings['max_link_width']} {readings['max_link_speed']})"
    )
    try:
        width, max_width = int(readings["current_link_width"]), int(readings["max_link_width"])
    except ValueError:
        return result("Failed", measured, expected, "link width is not a number")
    speed, max_speed = _gts(readings["current_link_speed"]), _gts(readings["max_link_speed"])
    problems = []
    if width != max_width:
        problems.append(f"trained at x{width} of x{max_width}")
    if max_speed is None:
        problems.append("max link speed unknown")
    if not gpu and speed != max_speed:
        problems.append(f"trained at {readings['current_link_speed']}, not its maximum")
    if row.pcie is not None:
        if width < row.pcie.width:
            problems.append(f"x{width} is below x{row.pcie.width}")
        if max_speed is not None and max_speed < row.pcie.speedGTs:
            problems.append(f"{max_speed:g} GT/s is below {row.pcie.speedGTs:g} GT/s")
    if problems:
        return result("Failed", measured, expected, "; ".join(problems))
    return result("Passed", measured, expected)


# --- NVLink --------------------------------------------------------------------------------


def nvlink(acc: Accelerator, row: ClassExpectation, nvml: NvmlReadings | None) -> ProbeResult:
    want = row.nvlinkActiveLinks
    expected = f"at least {want} active links" if want is not None else "every link active"

    result = _reporter("nvlink", acc.pciBusId, row, expected)

    if nvml is None:
        return result("NotRun", reason="NVML was not asked (no NVML source)")
    if not nvml.available:
        return result("NotRun", reason=f"NVML unavailable: {nvml.reason}")
    gpu = nvml.gpus.get(acc.pciBusId)
    if gpu is None:
        why = nvml.errors.get(acc.pciBusId, "NVML has no answer for this GPU")
        return result("NotRun", reason=why)
    if gpu.nvlinks is None:
        return result("NotRun", reason="NVML reported no NVLink state for this GPU")
    active = sum(1 for link in gpu.nvlinks if link.active)
    measured = f"{active} of {len(gpu.nvlinks)} links active"
    if (want is not None and active < want) or (want is None and active < len(gpu.nvlinks)):
        down = [str(link.link) for link in gpu.nvlinks if not link.active]
        return result("Failed", measured, f"links down: {', '.join(down) or 'none reported'}")
    return result("Passed", measured)


# --- RDMA NICs -----------------------------------------------------------------------------


def _nic(
    tree: SysfsTree, nic: Interface, row: ClassExpectation, tools: Tools, index: int
) -> list[ProbeResult]:
    device = nic.rdmaDevice or nic.name
    if nic.link is not None and nic.link.verdict == "Failed":
        why = (
            f"link Failed ({nic.link.reason}): health taints the device; "
            "verification measures working links"
        )
        return [
            ProbeResult(probe=p, device=device, deviceClass=row.name, outcome="Skipped", reason=why)
            for p in ("pcie-link", "rdma-port", "rdma-errors", "nic-bandwidth")
        ]
    pcie = pcie_link(tree, nic.pciBusId, row, gpu=False)
    ports = [p.port for p in nic.link.ports] if nic.link else []
    return [
        pcie.model_copy(update={"device": f"{device} ({nic.pciBusId})"}),
        rdma_port(tree, device, ports, row),
        rdma_errors(tree, device, ports, row),
        bandwidth.nic_bandwidth(device, row, tools, index),
    ]


def _rate_gbps(rate: str) -> tuple[float, str | None] | None:
    """'400 Gb/sec (4X NDR)' -> (400.0, '4X')."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec(?:\s*\((\d+X)?)?", rate)
    return (float(m.group(1)), m.group(2)) if m else None


def rdma_port(tree: SysfsTree, device: str, ports: list[int], row: ClassExpectation) -> ProbeResult:
    want = row.rdmaRateGbps
    expected = (
        f"every port at least {want} Gb/s" if want is not None else "every port rate readable"
    )

    result = _reporter("rdma-port", device, row, expected)

    if not ports:
        return result("NotRun", reason="no ports readable")
    seen: list[str] = []
    slow: list[str] = []
    for port in ports:
        rate = tree.read(f"class/infiniband/{device}/ports/{port}/rate")
        if not isinstance(rate, str):
            return result("NotRun", "; ".join(seen) or None, str(rate))
        parsed = _rate_gbps(rate)
        seen.append(f"port {port}: {rate}")
        if parsed is None:
            return result("Failed", "; ".join(seen), f"port {port}: rate not understood")
        if want is not None and parsed[0] < want:
            slow.append(f"port {port} at {parsed[0]:g} Gb/s")
    if slow:
        return result("Failed", "; ".join(seen), "; ".join(slow))
    return result("Passed", "; ".join(seen))


def rdma_errors(
    tree: SysfsTree, device: str, ports: list[int], row: ClassExpectation
) -> ProbeResult:
    limits = row.rdmaErrorCounters
    expected = ", ".join(f"{k} <= {v}" for k, v in sorted(limits.items())) or "no limits"

    result = _reporter("rdma-errors", device, row, expected)

    if not ports:
        return result("NotRun", reason="no ports readable")
    read: list[str] = []  # every counter read, for the reason
    over: list[str] = []
    nonzero: list[str] = []
    for port in ports:
        for counter, limit in sorted(limits.items()):
            value = tree.read_int(f"class/infiniband/{device}/ports/{port}/counters/{counter}")
            if not isinstance(value, int):
                continue  # not every link layer offers every counter; judged on what it has
            read.append(f"port {port} {counter}={value}")
            if value:
                nonzero.append(f"port {port} {counter}={value}")
            if value > limit:
                over.append(f"port {port} {counter}={value} > {limit}")
    if not read:
        return result("NotRun", reason="none of the expected error counters is readable")
    measured = f"{len(read)} counters read" + (f": {'; '.join(nonzero)}" if nonzero else ", all 0")
    if over:
        return result("Failed", measured, "; ".join(over))
    return result("Passed", measured)


def gpu_bandwidth(
    gpus: list[Accelerator], rows: list[ClassExpectation], tools: Tools
) -> ProbeResult:
    # A node mixing classes is held to its least demanding class (the weakest pair decides).
    wants = [r.gpuBandwidthGBs for r in rows if r.gpuBandwidthGBs is not None]
    row = min(rows, key=lambda r: r.gpuBandwidthGBs or 0.0)
    return bandwidth.gpu_bandwidth(len(gpus), row, min(wants) if wants else None, tools)
