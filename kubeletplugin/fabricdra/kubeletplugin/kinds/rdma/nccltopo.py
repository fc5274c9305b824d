"""NCCL's XML topology (`NCCL_TOPO_FILE`) for the GPUs and NICs a container was given: pure,
kind-agnostic inputs in, the file's text out (nccltopofiles.py reads the facts and writes it).

The format is the one NCCL itself loads and dumps (github.com/NVIDIA/nccl, src/graph/xml.cc
`ncclTopoXmlLoadSystem` / `ncclTopoXmlLoadCpu` / `ncclTopoXmlLoadPci` / `ncclTopoXmlLoadNic`,
src/graph/topo.cc `ncclTopoAddCpu` / `ncclTopoAddPci` / `ncclTopoAddNet`,
src/graph/xml.h `NCCL_TOPO_XML_VERSION`):

    <system version="1">
      <cpu numaid= affinity= arch= vendor= familyid= modelid=>
        <pci busid= class= vendor= device= subsystem_vendor= subsystem_device= link_speed=
             link_width=>                              (one per PCIe switch, as NCCL draws it)
          <pci busid= class= ...><gpu sm=/></pci>
          <pci busid= class= link_speed= link_width=><nic><net name= rail=/></nic></pci>
        </pci>
      </cpu>
    </system>

What NCCL does with the file decides what goes in it (topo.cc `ncclTopoGetSystem`):
- It matches its own GPU by `busid` and fills every attribute the file leaves out (NVML, sysfs);
  a net by `name` (the net plugin's device name: the HCA, `mlx5_0`) and then reads nothing more
  from sysfs for it or the `pci` nodes above it. So every `pci` node on a NIC's path carries
  `class`, `link_speed` and `link_width`, and every `cpu` `arch` (and on x86 `vendor`, on
  Intel `familyid`/`modelid`), or `ncclTopoAddPci`/`ncclTopoAddCpu` fail: such a file is not
  written (`TopologyError`).
- `rank`, `dev`, `gdr`, `keep` (gpu) and `dev`, `speed`, `port`, `guid`, `maxconn`, `gdr`
  (net) are the running process's facts (its rank, the CUDA/plugin index inside the
  container, GPUDirect support): NCCL sets them itself, and for `gdr`, `speed`, `guid`,
  `port`, `maxconn` a value in the file would *win* (`xmlInitAttr*`), so none is written.
  A GPU's `link_speed`/`link_width` are left to NCCL too: it reads the current PCIe
  generation from NVML, which a sysfs maximum would override.
- `rail` (topo.cc `ncclTopoAddNet`, NCCL 2.30+): with NCCL_CROSS_NIC=0 a ring leaves a node
  only through a NIC of the rail it entered by (search.cc `ncclTopoSearchCheckNet`); older
  NCCL ignores the attribute.
- Nodes without a `keep` descendant are trimmed (`ncclTopoTrimXml`): a GPU no rank of the
  container drives, or a NIC its net plugin cannot open, costs nothing.

NCCL draws a PCIe switch as its upstream port only: going up from a function it skips one
bridge (the switch's downstream port) and keeps the next, and stops at the root complex
(xml.cc `ncclTopoGetXmlFromSys`, "Rewind two '/' and follow the upper PCI switch"). Drawing
every bridge would make a GPU and the NIC beside it three bridges apart (PXB) instead of one
switch (PIX); `nccl_chain` draws the tree as NCCL would.

NCCL's parser is small (xml.cc `xmlGetNode`): attributes are separated by one space, values
are double-quoted with no escapes and at most 255 characters, indentation is spaces; there is
no `<?xml?>` declaration. `render` refuses a value it could not read back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

VERSION = 1  # NCCL_TOPO_XML_VERSION (src/graph/xml.h)
MAX_VALUE = 255  # MAX_STR_LEN (src/graph/xml.h); NCCL keeps one byte for the terminator
_NCCL_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")  # checkBDFFormat
_BAD = re.compile(r"[\"<>&\x00-\x1f]")


class TopologyError(ValueError):
    """A fact NCCL needs for this file is missing or cannot be written: no file."""


@dataclass(frozen=True, slots=True)
class PciFacts:
    """What NCCL would read from sysfs for one PCI function (xml.cc
    `ncclTopoGetXmlFromSys`): `class`, the ids, and the link as NCCL takes it (the lower of
    the function's and its upstream port's `max_link_*`). None: unknown."""

    pci_class: str | None = None
    vendor: str | None = None
    device: str | None = None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    link_speed: str | None = None
    link_width: int | None = None


@dataclass(frozen=True, slots=True)
class CpuFacts:
    """The host CPU as NCCL names it (xml.cc `ncclTopoGetXmlFromCpu`): `arch` x86_64, arm64
    or ppc64; on x86 the CPUID vendor string and family/model (with their extended bits)."""

    arch: str
    vendor: str | None = None
    family: int | None = None
    model: int | None = None


@dataclass(frozen=True, slots=True)
class TopoDevice:
    """One granted GPU or NIC: its PCI function, the bridges above it (outermost first, as
    `PciTopology.pciSwitches` reversed), its NUMA node and CPUs (the kernel's local_cpulist).
    A GPU has `sm` (compute capability x 10, None: NCCL asks NVML); a NIC has `net` (the
    net plugin's device name) and `rail`."""

    bus_id: str
    upstream: tuple[str, ...]
    numa: int | None
    cpus: str | None
    gpu: bool = False
    sm: int | None = None
    net: str | None = None
    rail: int | None = None

    def __post_init__(self) -> None:
        if self.gpu == (self.net is not None):
            raise ValueError(f"{self.bus_id}: a topology device is a GPU or a NIC (net name)")


@dataclass
class _Pci:
    bus_id: str
    children: dict[str, _Pci] = field(default_factory=dict)
    device: TopoDevice | None = None


def nccl_chain(upstream: Sequence[str]) -> list[str]:
    """The bridges NCCL draws above a function whose upstream bridges are `upstream`
    (outermost first): every second one from the function up, while both levels are PCI
    functions (a switch's upstream port), outermost first."""
    full = [*upstream, "<device>"]
    out: list[str] = []
    i = len(full) - 1
    while i >= 2 and _NCCL_BDF.match(full[i - 1]) and _NCCL_BDF.match(full[i - 2]):
        out.append(full[i - 2])
        i -= 2
    return list(reversed(out))


def cpulist_mask(cpulist: str) -> str:
    """The kernel's cpumask form (`0003ff,f0003fff`: 32-bit groups, highest first) of a
    cpulist (`0-55,112-167`), which NCCL's `affinity` takes (src/include/cpuset.h
    `ncclStrToCpuset`). ValueError for a malformed list."""
    cpus: set[int] = set()
    for part in cpulist.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r} in {cpulist!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"no CPUs in {cpulist!r}")
    groups = max(cpus) // 32 + 1
    words = [0] * groups
    for c in cpus:
        words[c // 32] |= 1 << (c % 32)
    return ",".join(f"{w:08x}" for w in reversed(words))


def render(devices: Iterable[TopoDevice], pci: Mapping[str, PciFacts], cpu: CpuFacts) -> str:
    """The file's text for `devices` (`pci`: facts by bus id for every function and bridge
    drawn). Raises TopologyError for a missing fact NCCL requires or a value it cannot read."""
    devices = sorted({d.bus_id: d for d in devices}.values(), key=lambda d: d.bus_id)
    if not devices:
        raise TopologyError("no GPU or NIC to describe")
    by_numa: dict[int, dict[str, _Pci]] = {}
    affinity: dict[int, str] = {}
    for d in devices:
        numa = -1 if d.numa is None else d.numa  # NCCL's own reading of an unnamed node
        level = by_numa.setdefault(numa, {})
        for bridge in nccl_chain(d.upstream):
            level = level.setdefault(bridge, _Pci(bridge)).children
        level.setdefault(d.bus_id, _Pci(d.bus_id)).device = d
        if d.cpus and numa not in affinity:
            affinity[numa] = cpulist_mask(d.cpus)
    lines = [f'<system version="{VERSION}">']
    for numa in sorted(by_numa):
        attrs = [("numaid", str(numa))]
        if numa in affinity and len(affinity[numa]) <= MAX_VALUE:
            attrs.append(("affinity", affinity[numa]))
        attrs += _cpu_attrs(cpu)
        lines.append(f"  <cpu{_attrs(attrs)}>")
        for node in sorted(by_numa[numa].values(), key=lambda n: n.bus_id):
            _pci(node, pci, 2, lines)
        lines.append("  </cpu>")
    lines.append("</system>")
    return "\n".join(lines) + "\n"


def _cpu_attrs(cpu: CpuFacts) -> list[tuple[str, str]]:
    if cpu.arch not in ("x86_64", "arm64", "ppc64"):  # topo.cc kvDictCpuArch
        raise TopologyError(f"CPU architecture {cpu.arch!r} is not one NCCL knows")
    out = [("arch", cpu.arch)]
    if cpu.arch != "x86_64":
        return out
    if not cpu.vendor:
        raise TopologyError("the x86 CPU's vendor is unknown (NCCL requires it)")
    out.append(("vendor", cpu.vendor))
    if cpu.family is not None and cpu.model is not None:
        out += [("familyid", str(cpu.family)), ("modelid", str(cpu.model))]
    elif cpu.vendor in ("GenuineIntel", "CentaurHauls", "  Shanghai  "):
        raise TopologyError(f"the {cpu.vendor} CPU's family/model is unknown (NCCL requires it)")
    return out


def _pci(node: _Pci, facts: Mapping[str, PciFacts], depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    f = facts.get(node.bus_id, PciFacts())
    gpu = node.device is not None and node.device.gpu
    attrs = [("busid", node.bus_id)]
    if f.pci_class is not None:
        attrs.append(("class", f.pci_class))
    elif not gpu:
        raise TopologyError(f"PCI function {node.bus_id}: class unknown")
    for key, value in (
        ("vendor", f.vendor),
        ("device", f.device),
        ("subsystem_vendor", f.subsystem_vendor),
        ("subsystem_device", f.subsystem_device),
    ):
        if value is not None:
            attrs.append((key, value))
    if not gpu:  # a GPU's link NCCL reads from NVML (see the module docstring)
        if f.link_speed is None or f.link_width is None:
            raise TopologyError(f"PCI function {node.bus_id}: PCIe link speed or width unknown")
        attrs += [("link_speed", f.link_speed), ("link_width", str(f.link_width))]
    lines.append(f"{pad}<pci{_attrs(attrs)}>")
    d = node.device
    if d is not None and d.gpu:
        lines.append(f"{pad}  <gpu{_attrs([] if d.sm is None else [('sm', str(d.sm))])}/>")
    elif d is not None and d.net is not None:
        net = [("name", d.net)] + ([] if d.rail is None else [("rail", str(d.rail))])
        lines += [f"{pad}  <nic>", f"{pad}    <net{_attrs(net)}/>", f"{pad}  </nic>"]
    for child in sorted(node.children.values(), key=lambda n: n.bus_id):
        _pci(child, facts, depth + 1, lines)
    lines.append(f"{pad}</pci>")


def _attrs(attrs: Sequence[tuple[str, str]]) -> str:
    for key, value in attrs:
        if len(value) > MAX_VALUE - 1 or _BAD.search(value):
            raise TopologyError(f"{key}={value!r} cannot be written for NCCL's XML parser")
    return "".join(f' {key}="{value}"' for key, value in attrs)
