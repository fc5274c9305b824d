"""The devices this node offers through DRA: discovery's records turned into named units.

Pure: interfaces and accelerators (plus the node's RDMA mode and GPU health readings) in, a
`DeviceInventory` out. The ResourceSlice builder publishes it, prepare resolves the device
names a claim was allocated against it, and the health stream reports it, so the three agree
by construction.

Rules (issue 4, seeds 000 "The RDMA resource keys" and 003 "MIG profiles", "Health states"):

* Every accelerator a device kind serves (kinds/: NVIDIA, AMD) is a device (`gpu`);
  others (Gaudi, Huawei, Tenstorrent, ...) are reported by discovery (NodeDevices) but never
  offered, since a pod scheduled onto one could never start. A GPU with MIG mode on is
  offered as its MIG instances (`mig`), one device each, and **not also whole**: on a
  MIG-enabled GPU a process can only use MIG instances, so the parent has nothing to hand
  over (with MIG on and no instances, the GPU offers nothing until instances exist;
  NodeDevices still records it).
* Every RDMA endpoint is offered in its mode: a per-NIC override (`DeviceConfig.rdma_overrides`,
  by PCI address or netdev name) beats the node's mode (`DeviceConfig.rdma_mode`: the agent
  puts the node label `fabricdra.io/rdma-mode` there, else the `--rdma-mode` default). A
  physical function with virtual functions configured offers only its VFs (mode `vf`, unless
  `rdma_vfs` is off, or the PF's or the VF's own mode is `off`); otherwise the whole function
  is offered `exclusive` or `shared`, or not at all (`off`). An endpoint a prepared claim
  holds (`held`) is offered as it is held whatever the mode says now, so a mode change never
  moves a prepared device (prepare's in-use check refuses what the change would otherwise
  let two claims share); the agent counts a hold only while its claim is still in the API,
  and withholds a NIC a gone claim holds (`agent.Agent._take`, `apifacts.py`). An AWS EFA function
  is never an RDMA endpoint: it is its own kind (`efa`, kinds/efa.py), offered only with
  `DeviceConfig.efa`. An endpoint without a
  bound RDMA device name is offered in no mode: the name is what prepare resolves to a verbs
  character device, so without it there is nothing to hand over.
* Names are DNS labels derived from the PCI bus id (and MIG GPU/compute instance ids), never
  from enumeration order, so they are stable across passes and restarts:
  `gpu-0000-1b-00-0`, `mig-0000-1b-00-0-gi1-ci0`, `rdma-0000-1c-00-0` (a VF has its own bus
  id). An endpoint off the PCI bus is named after its RDMA device (`rdma-mlx5-4`). Names do
  not carry the RDMA mode, so a claim's device keeps resolving if the operator changes it.
* Health. RDMA, from the link verdict: `OK` → Healthy; `Failed` → Unhealthy (reason = the
  link's reason); `Unverified` or no verdict at all → Unknown. Unknown is not a failure (the
  seed: only Failed gates health), so it is reported as Unknown on kubelet's health stream
  and never tainted. GPUs, from `gpu_health` (keyed by PCI bus id): healthy → Healthy,
  unhealthy → Unhealthy with its reason, no reading (`None`, or no entry) → Unknown. A MIG
  instance has its parent's health. Unhealthy devices are kept, never dropped (kubelet's
  checkpoints name them), and tainted in the ResourceSlice. A GPU that left the PCI bus is
  kept too, from its last record (`lost`, passed in by the agent, which remembers every GPU
  it saw until it restarts, and across a restart while a claim holds it: seengpus.py):
  Unhealthy, and prepare refuses it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from fabricdra.api.inventory import Accelerator, Endpoint, MigDevice

from .discovery.nvlink import nvlink_groups
from .discovery.vendors import AMD, NVIDIA

if TYPE_CHECKING:  # annotations only: the model imports no family module nor NVML at run time
    from .discovery.nvml import NvmlReadings
    from .kinds.nvidia.migprofiles import Placement

RdmaMode = Literal["exclusive", "shared", "off"]
RDMA_MODES: tuple[RdmaMode, ...] = ("exclusive", "shared", "off")
HeldAs = Literal["exclusive", "shared"]  # how a prepared claim holds a whole function
DeviceType = Literal["gpu", "mig", "rdma", "efa", "gaudi"]
EndpointMode = Literal["exclusive", "shared", "vf"]
Health = Literal["Healthy", "Unhealthy", "Unknown"]

LOST_REASON = (
    "the GPU left the PCI bus (fell off the bus); kept while claims hold it or until the agent "
    "restarts"
)

DEFAULT_SHARED_HOLDERS = 64  # the ecosystem's shared-RDMA device plugin ships this default
MAX_NAME = 63  # a ResourceSlice device name is a DNS label


@dataclass(frozen=True)
class RdmaOverride:
    """One NIC's RDMA mode, beating the node's: `match` is a PCI address (`0000:1c:00.0`;
    `1c:00.0` means domain 0000) or a netdev name (`ens1f0`), of a PF or of one VF."""

    match: str
    mode: RdmaMode

    def matches(self, ep: Endpoint) -> bool:
        want = self.match.lower()
        if ep.pciBusId and want in (ep.pciBusId.lower(), ep.pciBusId.lower().removeprefix("0000:")):
            return True
        return ep.name is not None and self.match == ep.name


def parse_rdma_mode(value: str) -> RdmaMode:
    """A mode name as the flag, the chart and the node label spell it; ValueError otherwise."""
    for mode in RDMA_MODES:
        if value == mode:
            return mode
    raise ValueError(f"rdma mode must be exclusive, shared or off, not {value!r}")


def parse_override(text: str) -> RdmaOverride:
    """`MATCH=MODE` (`0000:1c:00.0=shared`, `ens1f0=off`), as `--rdma-override` takes it."""
    match, sep, mode = text.rpartition("=")
    if not sep or not match:
        raise ValueError(f"rdma override must be MATCH=MODE (PCI address or netdev), not {text!r}")
    try:
        return RdmaOverride(match, parse_rdma_mode(mode))
    except ValueError as e:
        raise ValueError(f"rdma override {text!r}: {e}") from None


@dataclass(frozen=True)
class DeviceConfig:
    """How this node offers its devices (read off the node's configuration, not chosen per
    claim)."""

    rdma_mode: RdmaMode = "exclusive"
    rdma_shared_holders: int = DEFAULT_SHARED_HOLDERS
    # Per NIC (a PF, or one VF), first match wins; beats `rdma_mode` (the node's).
    rdma_overrides: tuple[RdmaOverride, ...] = ()
    rdma_vfs: bool = True  # off: no VF is offered (a PF with VFs is still not offered whole)
    efa: bool = False  # offer AWS EFA functions (kinds/efa.py)
    # Their claims get FI_EFA_USE_DEVICE_RDMA=1: the node's EFA devices do RDMA read (p4d, p5).
    efa_device_rdma: bool = False
    gaudi: bool = False  # offer Intel Gaudi accelerators (kinds/gaudi/)
    # Which kinds this node offers at all: GPUs off lets fabricdra run beside NVIDIA's GPU DRA
    # driver (which then owns the GPUs) offering only NICs; discovery still reports everything.
    offer_gpus: bool = True
    offer_rdma: bool = True
    # Dynamic MIG (`--dynamic-mig`, docs/attributes.md "Dynamic MIG"): a MIG-mode GPU whose
    # model migprofiles.py knows is offered whole and as every profile placement, all drawing
    # on one counter set; off: MIG instances are offered as they exist (static MIG).
    dynamic_mig: bool = False
    # GPU sharing (`--gpu-shares`, gpusharing.py): each whole NVIDIA GPU is offered to up to
    # this many claims at once, with consumable memory and shares (1.36 model); 0: one claim.
    gpu_shares: int = 0

    def __post_init__(self) -> None:
        if self.gpu_shares < 0 or self.gpu_shares == 1:
            raise ValueError(
                f"GPU shares must be 0 (GPUs not shared) or at least 2, not {self.gpu_shares}"
            )
        for mode in (self.rdma_mode, *(o.mode for o in self.rdma_overrides)):
            if mode not in RDMA_MODES:
                raise ValueError(f"rdma mode must be exclusive, shared or off, not {mode!r}")
        if self.rdma_shared_holders < 1:
            raise ValueError(
                f"shared RDMA holders per endpoint must be at least 1, not "
                f"{self.rdma_shared_holders}"
            )


@dataclass(frozen=True)
class GpuHealth:
    healthy: bool | None  # None = unknown (no reading)
    reason: str | None = None  # e.g. "uncorrectable ECC errors: 3"
    # Unhealthy: each problem's cause token, a label value (`ecc`, `xid-79`; health.py).
    causes: tuple[str, ...] = ()


# Xids an application causes (bad address, illegal instruction, ...): not the GPU's fault (the
# NVIDIA device plugin's rule); health.py and xids.py use the same set.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class GpuInfo:
    """What NVML says about one NVIDIA GPU beyond the inventory record: the facts users of
    NVIDIA's DRA driver select on, in that driver's forms (versions as semver strings), and
    each MIG instance's compute capacities keyed by its UUID."""

    driver_version: str | None = None  # "550.54.15"
    cuda_driver_version: str | None = None  # "12.4.0"
    cuda_compute_capability: str | None = None  # "9.0.0"
    architecture: str | None = None
    brand: str | None = None
    addressing_mode: str | None = None  # "HMM", "ATS", "None": NVML's answer
    # The GPUs this one reaches over NVLink inside the node (discovery/nvlink.py); None: none.
    nvlink_group: str | None = None
    # NUMA nodes of the GPU's own memory (Grace HBM); empty: none known.
    memory_numa_nodes: tuple[int, ...] = ()
    # Application Xids seen since boot: published as an informative taint (effect None).
    application_xids: tuple[int, ...] = ()
    mig_capacity: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Each MIG instance's GPU instance placement start (memory slice), keyed by its UUID, where
    # NVML reported it (nvmlGpuInstanceGetInfo): what dynamic MIG adopts an instance at.
    mig_placements: Mapping[str, int] = field(default_factory=dict)


def gpu_info(nvml: NvmlReadings | None) -> dict[str, GpuInfo]:
    """Per PCI bus id, from this pass's NVML readings (nothing where NVML had no answer)."""
    if nvml is None or not nvml.available:
        return {}
    groups = nvlink_groups(nvml)
    out = {}
    for bus, g in nvml.gpus.items():
        cuda = g.cudaDriverVersion
        out[bus] = GpuInfo(
            driver_version=semver(g.driverVersion),
            cuda_driver_version=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}.0",
            cuda_compute_capability=semver(g.cudaComputeCapability),
            architecture=g.architecture,
            brand=g.brand,
            addressing_mode=g.addressingMode,
            nvlink_group=groups.get(bus),
            memory_numa_nodes=tuple(sorted(set(g.memoryNumaNodes or ()))),
            application_xids=tuple(
                sorted(
                    set(g.applicationXids or ())
                    | {x for x in g.xidErrors or () if x in APPLICATION_XIDS}
                )
            ),
            mig_capacity={
                m.uuid: {
                    k: v
                    for k, v in (
                        ("multiprocessors", m.multiprocessors),
                        ("copyEngines", m.copyEngines),
                        ("decoders", m.decoders),
                        ("encoders", m.encoders),
                        ("jpegEngines", m.jpegEngines),
                        ("ofaEngines", m.ofaEngines),
                    )
                    if v is not None
                }
                for m in g.migDevices
            },
            mig_placements={
                m.uuid: m.placementStart for m in g.migDevices if m.placementStart is not None
            },
        )
    return out


_SEMVER_PART = re.compile(r"^(0|[1-9][0-9]*)$")


def semver(version: str | None) -> str | None:
    """A dotted numeric version as a semver string (`9.0` -> `9.0.0`, `550.54.15` kept;
    leading zeros dropped: `535.104.05` -> `535.104.5`); None when it is not one."""
    if not version:
        return None
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    nums = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(nums) if all(_SEMVER_PART.match(n) for n in nums) else None


@dataclass(frozen=True)
class Device:
    """One device this node offers: what every kind has (its name, `type` and health), and its
    kind's own typed record (`payload`: a GPU's accelerator and NVML facts, an RDMA endpoint
    and its mode, ...; issue 31 point 3). Each kind defines its payload and a `payload_of`
    that reads it (kinds/rdma/ `RdmaPayload`, kinds/accelerator.py `GpuPayload`, ...); the
    core asks the kind's hooks (kinds/base.py `DeviceKind`), never the payload."""

    name: str
    type: DeviceType
    health: Health
    health_reason: str | None
    # Unhealthy: the causes as short label-value tokens (`ecc`, `xid-79`, `link-down`, `lost`),
    # what the device taint's value carries; the full text is `health_reason`.
    health_causes: tuple[str, ...] = ()
    # The building kind's own typed record; only its kind reads it.
    payload: object = None


@dataclass(frozen=True)
class DeviceInventory:
    devices: tuple[Device, ...]
    # Holders per shared endpoint. Where the API cannot share one device between claims
    # (1.34/1.35, consumable capacity off), resourceslices.py publishes a shared endpoint as
    # this many holder devices `<name>-s<k>`; `get` resolves those names to the endpoint too.
    shared_holders: int = DEFAULT_SHARED_HOLDERS
    # The devices offered to `shared_holders` claims at once (a shared RDMA endpoint), as
    # their kinds say (`DeviceKind.holders`; assembly.py asks them).
    holder_sets: frozenset[str] = frozenset()
    _by_name: dict[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Device] = {}
        for d in self.devices:
            if d.name in by_name:
                raise ValueError(f"two devices named {d.name!r}")
            by_name[d.name] = d
        object.__setattr__(self, "_by_name", by_name)
        # Only devices still here: an inventory narrowed by `replace(inv, devices=...)` (the
        # devices another advertiser hands out, withheld) keeps the others' answers.
        object.__setattr__(self, "holder_sets", self.holder_sets & by_name.keys())

    def get(self, name: str) -> Device | None:
        """The device a ResourceSlice device name stands for: its own name, or for a shared
        endpoint one of its holder names (`<name>-s<k>`, k < shared_holders)."""
        found = self._by_name.get(name)
        if found is not None:
            return found
        m = _HOLDER.match(name)
        if m is None or int(m.group(2)) >= self.shared_holders:
            return None
        return self._by_name.get(m.group(1)) if m.group(1) in self.holder_sets else None

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)


# --- accelerators -------------------------------------------------------------------------


def lost_accelerators(
    current: Sequence[Accelerator] | None, seen: Mapping[str, Accelerator]
) -> list[Accelerator]:
    """The GPUs in `seen` (the last record of every GPU this agent has seen, by bus id) that a
    complete enumeration (`current`) no longer finds: the kernel removed their PCI function
    (fell off the bus). An enumeration that failed (None) loses nothing."""
    if current is None:
        return []
    present = {acc.pciBusId for acc in current}
    return [acc for bus, acc in sorted(seen.items()) if bus not in present]


def gpu_name(acc: Accelerator) -> str:
    """The device name of a whole GPU (also what its MIG instances are part of)."""
    return dns_label("gpu", acc.pciBusId)


def placement_name(acc: Accelerator, placement: Placement) -> str:
    """The device name of one profile placement on a GPU: `mig-0000-1b-00-0-3g-40gb-m4`
    (profile 3g.40gb starting at memory slice 4)."""
    return dns_label("mig", acc.pciBusId, placement.profile.name, f"m{placement.start}")


def counter_set_name(acc: Accelerator) -> str:
    """The counter set a dynamic-MIG GPU's devices draw on (a DNS label): the GPU's name."""
    return gpu_name(acc)


def mig_name(acc: Accelerator, mig: MigDevice) -> str:
    """The device name of an existing MIG instance: `mig-0000-1b-00-0-gi1-ci0`."""
    if mig.gpuInstanceId is not None and mig.computeInstanceId is not None:
        return dns_label(
            "mig", acc.pciBusId, f"gi{mig.gpuInstanceId}", f"ci{mig.computeInstanceId}"
        )
    # Without instance ids the MIG UUID is the stable identity NVML offers.
    return dns_label("mig", mig.uuid.removeprefix("MIG-"))


# An accelerator is offered only while bound to its vendor's own kernel driver (kept in the
# inventory either way): on vfio-pci (passthrough to a VM) or unbound, prepare finds no
# /proc/driver/nvidia entry or device node to hand over.
VENDOR_DRIVERS = {NVIDIA: "nvidia", AMD: "amdgpu"}


# --- RDMA endpoints ----------------------------------------------------------------------


def endpoint_name(ep: Endpoint) -> str:
    """The device name of an RDMA endpoint (a PF's name is also what its VFs are part of)."""
    if ep.pciBusId:
        return dns_label("rdma", ep.pciBusId)
    return dns_label("rdma", ep.rdmaDevice or ep.name or "unknown")


# --- names -------------------------------------------------------------------------------

_NOT_LABEL = re.compile(r"[^a-z0-9]+")
_HOLDER = re.compile(r"^(.+)-s(0|[1-9][0-9]*)$")


def holder_name(device: str, k: int) -> str:
    """The name of shared holder k of a shared endpoint (fallback model only)."""
    return f"{device}-s{k}"


def dns_label(*parts: str) -> str:
    """Join parts into a DNS label: lowercase, runs of other characters become one '-'.
    Refuses a result over 63 characters rather than truncating (two truncated names could
    collide)."""
    name = _NOT_LABEL.sub("-", "-".join(parts).lower()).strip("-")
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"cannot make a device name (DNS label) from {parts!r}: got {name!r}")
    return name
