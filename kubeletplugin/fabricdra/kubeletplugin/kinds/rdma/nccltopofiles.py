"""The host side of `NCCL_TOPO_FILE` (agent flag `--nccl-topo-file`, default on): which granted
devices a claim's topology describes, the facts NCCL would read for them (sysfs, /proc/cpuinfo),
and the file itself, `<dir>/<claim uid>/topo.xml`, bind-mounted read-only at
`/var/run/fabricdra/nccl-topo-<claim uid>.xml` with `NCCL_TOPO_FILE` pointing at it (nccltopo.py
renders it; docs/kubelet-plugin.md has the rules).

Written for a claim with at least one whole NVIDIA GPU: NCCL builds its graph from GPUs, and a
file without one gives a NIC-only container nothing NCCL would use. Its content is pod-wide,
like NCCL_IB_HCA (ncclenv.py): the GPUs and NCCL NICs of the claim and of every prepared claim
a pod of it may use with it, and the files of those claims are rewritten to the same content,
so whichever claim's NCCL_TOPO_FILE a container ends with (CDI environment is last-wins) it
describes the same devices. Devices of the pod the container was not given cost nothing: NCCL
trims what none of its ranks or net devices claims.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog

from ... import claimfolders
from ...claimfolders import safe_uid
from ...devices import Device
from ...discovery.sysfs import Absent, SysfsTree, Unreadable
from ...kubelet.cdi import ContainerEdits, Mount, write_atomic
from .. import accelerator, rdma
from .nccltopo import CpuFacts, PciFacts, TopoDevice, nccl_chain

log = structlog.get_logger("fabricdra.nccltopo")

VAR = "NCCL_TOPO_FILE"
FILE_NAME = "topo.xml"
CONTAINER_DIR = "/var/run/fabricdra"


def container_path(claim_uid: str) -> str:
    return f"{CONTAINER_DIR}/nccl-topo-{claim_uid}.xml"


def device_name(claim_uid: str) -> str:
    """The claim-level CDI device that mounts the file and sets NCCL_TOPO_FILE."""
    return f"nccltopo-{claim_uid}"


def topo_device(device: Device, nccl_name: str | None) -> TopoDevice | None:
    """The topology entry of a granted device: a whole NVIDIA GPU, or a NIC NCCL's net plugin
    names `nccl_name` (its kind's NCCL HCA); None for anything else (MIG instances, AMD GPUs:
    RCCL's gpu attributes differ, EFA)."""
    gpu = accelerator.gpu_payload(device)
    if gpu is not None and device.type == "gpu" and gpu.mig is None and gpu.placement is None:
        acc, info = gpu.accelerator, gpu.info
        if acc.vendor != "nvidia":
            return None
        return TopoDevice(
            bus_id=acc.pciBusId,
            upstream=tuple(reversed(acc.topology.pciSwitches)),
            numa=acc.numaNode,
            cpus=acc.cpuAffinity,
            gpu=True,
            sm=_sm(info.cuda_compute_capability if info else None),
        )
    if nccl_name is None or not isinstance(device.payload, rdma.RdmaPayload):
        return None
    ep, iface = device.payload.endpoint, device.payload.interface
    if ep.pciBusId is None:
        return None
    # A VF shares its PF's port and cable: its rail, and where the kernel names none its NUMA
    # node and CPUs, are the PF's.
    parent = iface if iface is not None else ep
    record = getattr(parent, "scaleOut", None)
    return TopoDevice(
        bus_id=ep.pciBusId,
        upstream=tuple(reversed(ep.topology.pciSwitches)),
        numa=ep.numaNode if ep.numaNode is not None else parent.numaNode,
        cpus=ep.cpuAffinity or parent.cpuAffinity,
        net=nccl_name,
        # Measured rails only, the rule of NCCL_CROSS_NIC=0 (prepare.rail_aligned): NCCL
        # confines a ring to one rail by this value, so a declared or disputed one stays out.
        rail=record.rail if record is not None and record.railSource == "measured" else None,
    )


def _sm(capability: str | None) -> int | None:
    """NVML's "9.0.0" (or "9.0") as NCCL's `sm` 90; None when unknown or malformed."""
    if not capability:
        return None
    parts = capability.split(".")
    try:
        return int(parts[0]) * 10 + int(parts[1] if len(parts) > 1 else 0)
    except ValueError:
        return None


def pci_facts(tree: SysfsTree, devices: Iterable[TopoDevice]) -> dict[str, PciFacts]:
    """What NCCL would read from sysfs for every function drawn for `devices`."""
    wanted = {b for d in devices for b in (*nccl_chain(d.upstream), d.bus_id)}
    return {bus: _read_pci(tree, bus) for bus in sorted(wanted)}


def _read_pci(tree: SysfsTree, bus_id: str) -> PciFacts:
    path = tree.resolve(f"bus/pci/devices/{bus_id}")
    if isinstance(path, Absent | Unreadable):
        return PciFacts()

    def text(rel: str) -> str | None:
        value = tree.read(rel)
        return None if isinstance(value, Absent | Unreadable) or not value else value

    up = path.rsplit("/", 1)[0]  # the upstream port (xml.cc reads "../max_link_*")
    # NCCL takes the lower of the function's and its upstream port's maximum: what the link
    # can train to (xml.cc ncclTopoGetXmlFromSys).
    speeds = [s for s in (text(f"{path}/max_link_speed"), text(f"{up}/max_link_speed")) if s]
    widths = [
        w
        for w in (tree.read_int(f"{path}/max_link_width"), tree.read_int(f"{up}/max_link_width"))
        if isinstance(w, int)
    ]
    rated = [(g, s) for s in speeds if (g := _gts(s)) is not None]
    speed = min(rated)[1] if rated and len(rated) == len(speeds) else None
    return PciFacts(
        pci_class=text(f"{path}/class"),
        vendor=text(f"{path}/vendor"),
        device=text(f"{path}/device"),
        subsystem_vendor=text(f"{path}/subsystem_vendor"),
        subsystem_device=text(f"{path}/subsystem_device"),
        link_speed=speed,
        link_width=min(widths) if widths else None,
    )


def _gts(speed: str) -> float | None:
    """`32.0 GT/s PCIe` -> 32.0 (the kernel's max_link_speed); None: not that form."""
    try:
        return float(speed.split()[0])
    except (ValueError, IndexError):
        return None


_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}
_ARCH.update({"ppc64le": "ppc64", "ppc64": "ppc64"})


def cpu_facts(proc_root: Path, machine: str | None = None) -> CpuFacts:
    """The host CPU as NCCL names it: the architecture (the agent runs on the host's kernel),
    and from `/proc/cpuinfo`'s first processor its `vendor_id`, `cpu family` and `model`
    (already including CPUID's extended family/model bits, as NCCL computes them)."""
    machine = machine or platform.machine()
    arch = _ARCH.get(machine, machine)
    fields: dict[str, str] = {}
    try:
        text = (proc_root / "cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block only
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return CpuFacts(
        arch=arch,
        vendor=fields.get("vendor_id") or None,
        family=_int(fields.get("cpu family")),
        model=_int(fields.get("model")),
    )


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class TopoFiles:
    """The files: `<dir>/<claim uid>/topo.xml` on the host (under the plugin folder, which the
    chart mounts at the same host path)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def host_path(self, claim_uid: str) -> Path:
        return self.dir / claim_uid / FILE_NAME

    def exists(self, claim_uid: str) -> bool:
        return safe_uid(claim_uid) and self.host_path(claim_uid).is_file()

    def write(self, claim_uid: str, text: str) -> None:
        """Write (only when the content changed). Raises OSError."""
        path = self.host_path(claim_uid)
        data = text.encode()
        try:
            if path.read_bytes() == data:
                return
        except OSError:
            pass
        write_atomic(path, data, durable=False)

    def edits(self, claim_uid: str) -> ContainerEdits:
        target = container_path(claim_uid)
        return ContainerEdits(
            env=(f"{VAR}={target}",),
            mounts=(Mount(str(self.host_path(claim_uid)), target, options=("ro", "bind")),),
        )

    def remove(self, claim_uid: str) -> None:
        claimfolders.remove(self.dir, claim_uid)

    def keep_only(self, claim_uids: Iterable[str]) -> None:
        """Remove the files of claims the checkpoint no longer names (another boot's)."""
        claimfolders.keep_only(self.dir, claim_uids, "the NCCL topology")


def has_gpu(devices: Sequence[TopoDevice]) -> bool:
    return any(d.gpu for d in devices)
