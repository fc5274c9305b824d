"""The probes of a verification run: discovery records + sysfs + NVML in, `ProbeResult`s out.

Each probe reads one thing and compares it with the expected value of the device's class
(`fabricdra.api.verification`, data). A reading that could not be taken is `NotRun` with the
reason — never `Passed` and never silently dropped. Which devices are probed:

* every accelerator: `pcie-link`; NVIDIA GPUs also `nvlink` where their class expects NVLink;
* every RDMA-capable physical NIC: `pcie-link`, `rdma-port`, `rdma-errors`, `nic-bandwidth`
  (the tools — the active probes — run first, in parallel: `active_probes`, active.py).
  VFs share their PF's link and are not probed separately. A NIC whose link verdict is Failed
  is `Skipped`: it is down, health already taints it, and verification measures working links;
* the node, once: `host-bandwidth`, `gpu-bandwidth` and `nccl-allreduce` when it has NVIDIA
  GPUs, and `inventory` — the GPUs and
  compute HCAs the system model promises (`SystemProfile`: built in per DMI model, or an
  operator's `--expect`), each compute HCA's port rate held to the model's rate in `rdma-port`.

PCIe rule: width must equal `max_link_width` (a device trained on fewer lanes is degraded) and
both must reach the class's minimum. Speed: a NIC's `current_link_speed` must equal its
`max_link_speed`; a GPU's current speed is recorded but not compared, because NVIDIA GPUs drop
the link to a lower generation when idle — its `max_link_speed` must reach the class minimum,
and a link stuck at a low speed shows up in the bandwidth probe. Every bridge above the device
that reports a link (`pciSwitches`: the switch ports and the root port) is held to its own
maximum too, width and speed — an x4 Gen1 uplink halves nothing on the device's own link files
yet starves everything below it. The bridge right above a GPU shares the GPU's link (its speed
drops with the GPU's), so there only the width is compared.

Error counters are cumulative since the driver loaded: `rdma-errors` judges how much each rose
over a window that starts at the `ErrorBaseline` (the first reading, then each run's last one)
against the per-counter limit, so a cable reseat (the repair) does not fail the node for good.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabricdra.api.inventory import Accelerator, Interface
from fabricdra.api.verification import (
    ClassExpectation,
    Expectations,
    Outcome,
    ProbeName,
    ProbeResult,
    SystemProfile,
    profile_for,
)

from ..discovery.nvml import NvmlReadings
from ..discovery.sysfs import SysfsTree
from . import active
from .active import Executor, Judge, Plan, Step


@dataclass(frozen=True)
class Tools:
    """Where and how the active probes run (docs/verification.md, "Active probes")."""

    path: str | None = None  # a PATH-style search list for the tools; None: as found
    timeout_seconds: float = 300.0  # each tool's own limit
    # False: the operator turned the active probes off; they are Skipped and not required.
    run_bandwidth: bool = True
    executor: Executor | None = None  # where the script runs; None: here (LocalExecutor)
    port_base: int = active.IB_PORT_BASE  # the first NIC's loopback port


DMI_FILES = ("class/dmi/id/product_name", "class/dmi/id/board_name")


@dataclass(frozen=True)
class SystemChoice:
    """The system profile a run holds the node to (None: none), and how it was chosen."""

    profile: SystemProfile | None
    why: str


def choose_system(tree: SysfsTree, expect: SystemProfile | None = None) -> SystemChoice:
    """An operator's profile wins; else the built-in one the DMI product/board name matches."""
    if expect is not None:
        return SystemChoice(expect, f"expected profile {expect.name!r} (--expect)")
    names = [r.strip() for r in (tree.read(f) for f in DMI_FILES) if isinstance(r, str)]
    shown = " / ".join(repr(n) for n in names) or "unreadable"
    profile = profile_for(names)
    if profile is None:
        return SystemChoice(
            None, f"no system profile for DMI model {shown}: pass --expect to hold it to one"
        )
    return SystemChoice(profile, f"{profile.name} (DMI model {shown})")


@dataclass
class ErrorBaseline:
    """Where the error counters' window starts: (RDMA device, port, counter) -> the value read
    then. Empty: the window starts at this run's first reading."""

    readings: dict[tuple[str, int, str], int] = field(default_factory=dict)

    def clear(self) -> None:
        self.readings.clear()


def run_probes(
    tree: SysfsTree,
    interfaces: list[Interface],
    accelerators: list[Accelerator],
    nvml: NvmlReadings | None,
    expectations: Expectations,
    tools: Tools = Tools(),  # frozen: a shared default is safe
    *,
    system: SystemChoice | None = None,
    baseline: ErrorBaseline | None = None,
    busy: str | None = None,
) -> list[ProbeResult]:
    """Every probe of one run. `busy`: why the node is not idle (claims prepared on it): the
    active probes are then NotRun with that reason — they would disturb, and be disturbed by,
    the workloads."""
    system = system or choose_system(tree)
    baseline = baseline if baseline is not None else ErrorBaseline()
    results: list[ProbeResult] = []
    nvidia: list[tuple[Accelerator, ClassExpectation]] = []
    for acc in sorted(accelerators, key=lambda a: a.pciBusId):
        row = expectations.for_gpu(acc.deviceClass)
        results.append(
            pcie_link(tree, acc.pciBusId, row, gpu=True, uplinks=acc.topology.pciSwitches)
        )
        if acc.vendor == "nvidia":
            nvidia.append((acc, row))
            if row.nvlinkActiveLinks is not None or "nvlink" in row.required:
                results.append(nvlink(acc, row, nvml))
    nic_row = expectations.for_nic()
    nics = [i for i in sorted(interfaces, key=lambda i: i.name) if i.rdma and i.rdmaDevice]
    compute = compute_hcas(nics, accelerators, system.profile)
    _take_baseline(tree, nics, nic_row, baseline)
    # The tools run first (in parallel), so the error window includes the links under load.
    measured = active_probes(tree, nvidia, nics, nic_row, tools, busy)
    for nic in nics:
        hca_rate = None
        if system.profile and system.profile.hcas and nic in compute:
            hca_rate = (system.profile.name, system.profile.hcas.rateGbps)
        results.extend(_nic(tree, nic, nic_row, baseline, measured, hca_rate))
    results.extend(r for r in measured if r.probe != "nic-bandwidth")
    results.extend(inventory(accelerators, compute, system))
    return results


# --- active probes: the tools ---------------------------------------------------------------


def active_probes(
    tree: SysfsTree,
    nvidia: list[tuple[Accelerator, ClassExpectation]],
    nics: list[Interface],
    nic_row: ClassExpectation,
    tools: Tools,
    busy: str | None = None,
) -> list[ProbeResult]:
    """Plan the node's active probes (the GPU tools once for the node, one loopback per
    working NIC), run them and judge them. Turned off: Skipped (not required); the node
    busy: NotRun, with why."""
    plan = plan_active(tree, nvidia, nics, nic_row, tools)
    if not tools.run_bandwidth or busy is not None:
        outcome: Outcome = "Skipped" if not tools.run_bandwidth else "NotRun"
        why = "active probes turned off by the operator" if not tools.run_bandwidth else busy
        return [
            r.model_copy(update={"outcome": outcome, "reason": why})
            for j in plan.judges
            for r in active._all(j, "NotRun", "")
        ] + _single_gpu(nvidia)
    executor = tools.executor or active.LocalExecutor()
    return active.execute(plan, executor, tools.path) + _single_gpu(nvidia)


def _single_gpu(nvidia: list[tuple[Accelerator, ClassExpectation]]) -> list[ProbeResult]:
    if len(nvidia) != 1:
        return []
    row = nvidia[0][1]
    return [
        ProbeResult(
            probe="gpu-bandwidth",
            device="node",
            deviceClass=row.name,
            outcome="Skipped",
            expected="a GPU pair",
            reason="one GPU: no GPU pair to measure",
        )
    ]


def plan_active(
    tree: SysfsTree,
    nvidia: list[tuple[Accelerator, ClassExpectation]],
    nics: list[Interface],
    nic_row: ClassExpectation,
    tools: Tools,
) -> Plan:
    """The lanes: the GPU tools one after another in one lane (they share the NVLinks), each
    working NIC's loopback in a lane of its own."""
    ids = iter(active.step_ids(1 + 1 + len(nics)))
    plan = Plan()
    timeout = tools.timeout_seconds
    if nvidia:
        rows = [r for _, r in nvidia]
        # A node mixing classes is held to its least demanding class (the weakest decides).
        row = min(rows, key=lambda r: r.gpuBandwidthGBs or 0.0)
        tests = [active.H2D_TEST] + ([active.D2D_TEST] if len(nvidia) > 1 else [])
        gpu_lane = [
            Judge(
                Step(next(ids), active.NVBANDWIDTH, ("-t", *tests), timeout),
                "gpu-bandwidth",
                "node",
                row,
                _least(r.gpuBandwidthGBs for r in rows),
                gpu_pairs=len(nvidia) > 1,
                host_want=_least(r.hostBandwidthGBs for r in rows),
            )
        ]
        nccl_rows = [r for r in rows if r.ncclAllReduceBusGBs is not None] or rows
        args = ("-b", active.NCCL_MESSAGE, "-e", active.NCCL_MESSAGE, "-f", "2")
        gpu_lane.append(
            Judge(
                Step(next(ids), active.ALL_REDUCE_PERF, (*args, "-g", str(len(nvidia))), timeout),
                "nccl-allreduce",
                "node",
                min(nccl_rows, key=lambda r: r.ncclAllReduceBusGBs or 0.0),
                _least(r.ncclAllReduceBusGBs for r in rows),
            )
        )
        plan.lanes.append(gpu_lane)
    for index, nic in enumerate(nics):
        if nic.link is not None and nic.link.verdict == "Failed":
            continue  # down: Skipped with the NIC's other probes
        device = nic.rdmaDevice or nic.name
        port = str(tools.port_base + index)
        args = ("-d", device, "--report_gbits", "-F", "-p", port)
        step = Step(next(ids), active.IB_WRITE_BW, args, timeout, loopback=True)
        plan.lanes.append(
            [Judge(step, "nic-bandwidth", device, nic_row, _nic_want(tree, nic, nic_row))]
        )
    return plan


def _least(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None


def _nic_want(tree: SysfsTree, nic: Interface, row: ClassExpectation) -> float | None:
    """The loopback minimum: the class's absolute floor, or its share of the slowest port's
    rate, whichever is higher."""
    wants = [row.nicBandwidthGbps] if row.nicBandwidthGbps is not None else []
    if row.nicBandwidthFraction is not None:
        rates = []
        for port in _ports(nic):
            rate = tree.read(f"class/infiniband/{nic.rdmaDevice or nic.name}/ports/{port}/rate")
            parsed = _rate_gbps(rate) if isinstance(rate, str) else None
            if parsed is not None:
                rates.append(parsed[0])
        if rates:
            wants.append(round(min(rates) * row.nicBandwidthFraction, 1))
    return max(wants) if wants else None


# --- inventory: what the system model promises ----------------------------------------------


def compute_hcas(
    nics: list[Interface], accelerators: list[Accelerator], profile: SystemProfile | None
) -> list[Interface]:
    """The node's compute HCAs: its RDMA PFs; with `nextToGpu`, only those sharing a PCIe
    switch with a GPU (the bridges above both, short of the root port: RDMA names differ
    between OS images, the topology does not)."""
    if profile is None or profile.hcas is None or not profile.hcas.nextToGpu:
        return list(nics)
    gpu_switches = {b for a in accelerators for b in a.topology.pciSwitches[:-1]}
    return [n for n in nics if gpu_switches & set(n.topology.pciSwitches[:-1])]


def inventory(
    accelerators: list[Accelerator], compute: list[Interface], system: SystemChoice
) -> list[ProbeResult]:
    """The GPUs and compute HCAs against the system profile; with none, one NotRun that
    says why (an unknown model is not a failure)."""
    profile = system.profile
    if profile is None:
        return [
            ProbeResult(
                probe="inventory",
                device="node",
                deviceClass="-",
                outcome="NotRun",
                expected="a system profile",
                reason=system.why,
            )
        ]
    out: list[ProbeResult] = []
    if profile.gpus is not None:
        want = profile.gpus
        what = want.product or want.deviceClass or "GPUs"
        same = [a for a in accelerators if want.deviceClass in (None, a.deviceClass)]
        others = sorted(
            {a.deviceClass or a.productName or a.vendor for a in accelerators} - {want.deviceClass}
        )
        measured = f"{len(same)} of {want.count} GPUs" + (
            f" (also: {', '.join(o for o in others if o)})" if others and want.deviceClass else ""
        )
        expected = f"{want.count} x {what}" + (
            f" ({want.deviceClass})" if want.deviceClass and want.product else ""
        )
        outcome: Outcome = "Failed" if len(same) < want.count else "Passed"
        reason = f"{len(same)} of {want.count} GPUs ({what}): {system.why}"
        out.append(
            ProbeResult(
                probe="inventory",
                device="gpus",
                deviceClass=profile.name,
                outcome=outcome,
                measured=measured,
                expected=expected,
                reason=reason if outcome == "Failed" else None,
            )
        )
    if profile.hcas is not None and (profile.hcas.count is not None or profile.hcas.linkLayer):
        hcas = profile.hcas
        compute = sorted(compute, key=lambda n: _natural(n.rdmaDevice or n.name or ""))
        names = [n.rdmaDevice or n.name or "?" for n in compute]
        problems: list[str] = []
        if hcas.count is not None and len(compute) < hcas.count:
            where = " next to a GPU" if hcas.nextToGpu else ""
            problems.append(f"{len(compute)} of {hcas.count} compute HCAs{where}")
        if hcas.linkLayer:
            wrong = [
                f"{name} is {n.linkLayer or 'of unknown link layer'}"
                for name, n in zip(names, compute, strict=True)
                if n.linkLayer != hcas.linkLayer
            ]
            problems.extend(wrong)
        count = f"{hcas.count} x " if hcas.count is not None else ""
        layer = f" {hcas.linkLayer}" if hcas.linkLayer else ""
        rate = f" at {hcas.rateGbps} Gb/s" if hcas.rateGbps else ""
        out.append(
            ProbeResult(
                probe="inventory",
                device="compute-hcas",
                deviceClass=profile.name,
                outcome="Failed" if problems else "Passed",
                measured=f"{len(compute)}: {', '.join(names) or 'none'}",
                expected=f"{count}compute HCA{layer}{rate}",
                reason="; ".join(problems) + f": {system.why}" if problems else None,
            )
        )
    return out


def _natural(name: str) -> list[Any]:
    """'mlx5_10' after 'mlx5_9'."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


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


def _link(tree: SysfsTree, bus_id: str) -> dict[str, str] | str:
    """The four link files of a PCI function, or why they could not be read."""
    readings = {}
    for name in ("current_link_width", "max_link_width", "current_link_speed", "max_link_speed"):
        value = tree.read(f"bus/pci/devices/{bus_id}/{name}")
        if not isinstance(value, str):
            return str(value)
        readings[name] = value
    return readings


def _uplink_problems(tree: SysfsTree, uplinks: list[str], *, gpu: bool) -> list[str]:
    """Each bridge above the device (innermost first) held to its own maximum. A bridge
    without link files (an integrated root port) is not judged."""
    problems = []
    for depth, bridge in enumerate(uplinks):
        link = _link(tree, bridge)
        if isinstance(link, str):
            continue
        try:
            width, max_width = int(link["current_link_width"]), int(link["max_link_width"])
        except ValueError:
            problems.append(f"uplink {bridge}: link width is not a number")
            continue
        wrong = []
        if width != max_width:
            wrong.append(f"x{width} of x{max_width}")
        speed, max_speed = _gts(link["current_link_speed"]), _gts(link["max_link_speed"])
        # Right above a GPU the bridge shares the GPU's link, and its idle speed drop.
        if not (gpu and depth == 0) and speed != max_speed:
            wrong.append(f"{link['current_link_speed']} of {link['max_link_speed']}")
        if wrong:
            problems.append(f"uplink {bridge} trained at {', '.join(wrong)}")
    return problems


def pcie_link(
    tree: SysfsTree,
    bus_id: str | None,
    row: ClassExpectation,
    *,
    gpu: bool,
    uplinks: list[str] | None = None,
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
    readings = _link(tree, bus_id)
    if isinstance(readings, str):
        return result("NotRun", None, expected, readings)
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
    problems.extend(_uplink_problems(tree, uplinks or [], gpu=gpu))
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
    tree: SysfsTree,
    nic: Interface,
    row: ClassExpectation,
    baseline: ErrorBaseline,
    measured: list[ProbeResult],
    hca_rate: tuple[str, int | None] | None = None,
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
    pcie = pcie_link(tree, nic.pciBusId, row, gpu=False, uplinks=nic.topology.pciSwitches)
    ports = _ports(nic)
    loopback = [r for r in measured if r.probe == "nic-bandwidth" and r.device == device]
    return [
        pcie.model_copy(update={"device": f"{device} ({nic.pciBusId})"}),
        rdma_port(tree, device, ports, row, hca_rate),
        # Judged after the loopback, so the window includes the link under load.
        rdma_errors(tree, device, ports, row, baseline),
        *loopback,
    ]


def _ports(nic: Interface) -> list[int]:
    return [p.port for p in nic.link.ports] if nic.link else []


def _take_baseline(
    tree: SysfsTree, nics: list[Interface], row: ClassExpectation, baseline: ErrorBaseline
) -> None:
    """Start the window of every counter that has none yet (the first pass, or after a reset)."""
    for nic in nics:
        device = nic.rdmaDevice or nic.name or ""
        for port in _ports(nic):
            for counter in row.rdmaErrorCounters:
                key = (device, port, counter)
                if key not in baseline.readings:
                    value = tree.read_int(_counter(device, port, counter))
                    if isinstance(value, int):
                        baseline.readings[key] = value


def _counter(device: str, port: int, counter: str) -> str:
    return f"class/infiniband/{device}/ports/{port}/counters/{counter}"


def _rate_gbps(rate: str) -> tuple[float, str | None] | None:
    """'400 Gb/sec (4X NDR)' -> (400.0, '4X')."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec(?:\s*\((\d+X)?)?", rate)
    return (float(m.group(1)), m.group(2)) if m else None


def rdma_port(
    tree: SysfsTree,
    device: str,
    ports: list[int],
    row: ClassExpectation,
    hca_rate: tuple[str, int | None] | None = None,
) -> ProbeResult:
    """Every port's rate at least the class's minimum, and a compute HCA's at least its system
    model's rate (`hca_rate`: the profile's name and rate)."""
    want = row.rdmaRateGbps
    model = ""
    if hca_rate is not None and hca_rate[1] is not None and hca_rate[1] > (want or 0):
        want, model = hca_rate[1], f" ({hca_rate[0]} compute HCA)"
    expected = (
        f"every port at least {want} Gb/s{model}"
        if want is not None
        else "every port rate readable"
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
    tree: SysfsTree,
    device: str,
    ports: list[int],
    row: ClassExpectation,
    baseline: ErrorBaseline | None = None,
) -> ProbeResult:
    """How much each counter rose since the baseline, against its limit; the baseline then
    moves to this reading (the next window starts here). A counter below its baseline was
    reset (driver reload, `perfquery -R`): it rose by what it reads now."""
    limits = row.rdmaErrorCounters
    expected = ", ".join(f"{k} rise <= {v}" for k, v in sorted(limits.items())) or "no limits"
    baseline = baseline if baseline is not None else ErrorBaseline()

    result = _reporter("rdma-errors", device, row, expected)

    if not ports:
        return result("NotRun", reason="no ports readable")
    read = 0
    rose: list[str] = []
    over: list[str] = []
    for port in ports:
        for counter, limit in sorted(limits.items()):
            value = tree.read_int(_counter(device, port, counter))
            if not isinstance(value, int):
                continue  # not every link layer offers every counter; judged on what it has
            read += 1
            key = (device, port, counter)
            start = baseline.readings.get(key, value)
            rise = value - start if value >= start else value
            baseline.readings[key] = value
            if rise:
                rose.append(f"port {port} {counter} +{rise} (now {value})")
            if rise > limit:
                over.append(f"port {port} {counter} rose by {rise} > {limit}")
    if not read:
        return result("NotRun", reason="none of the expected error counters is readable")
    measured = f"{read} counters read" + (f": {'; '.join(rose)}" if rose else ", none rose")
    if over:
        return result("Failed", measured, "; ".join(over))
    return result("Passed", measured)
