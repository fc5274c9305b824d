"""The devices this node offers through DRA: discovery's records turned into named units.

Pure: interfaces and accelerators (plus the node's RDMA mode and GPU health readings) in, a
`DeviceInventory` out. The ResourceSlice builder publishes it, prepare resolves the device
names a claim was allocated against it, and the health stream reports it, so the three agree
by construction.

Rules (issue 4, seeds 000 "The RDMA resource keys" and 003 "MIG profiles", "Health states"):

* Every accelerator is a device (`gpu`). A GPU with MIG mode on is offered as its MIG
  instances (`mig`), one device each, and **not also whole**: on a MIG-enabled GPU a process
  can only use MIG instances, so the parent has nothing to hand over (with MIG on and no
  instances, the GPU offers nothing until instances exist; NodeDevices still records it).
* Every RDMA endpoint is offered in the node's mode. A physical function with virtual
  functions configured offers only its VFs (mode `vf`); otherwise the whole function is
  offered `exclusive` or `shared` as `DeviceConfig.rdma_mode` says. EFA endpoints (driver
  `efa`) are skipped unless `DeviceConfig.efa` is on: AWS nodes advertise them through their
  own device plugin, and offering them twice would hand one out twice. An endpoint without a
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
  checkpoints name them), and tainted in the ResourceSlice.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from fabricdra.api.inventory import Accelerator, Endpoint, Interface, MigDevice

from .discovery.nvlink import nvlink_groups
from .discovery.nvml import NvmlReadings

RdmaMode = Literal["exclusive", "shared"]
DeviceType = Literal["gpu", "mig", "rdma"]
EndpointMode = Literal["exclusive", "shared", "vf"]
Health = Literal["Healthy", "Unhealthy", "Unknown"]

DEFAULT_SHARED_HOLDERS = 64  # the ecosystem's shared-RDMA device plugin ships this default
MAX_NAME = 63  # a ResourceSlice device name is a DNS label


@dataclass(frozen=True)
class DeviceConfig:
    """How this node offers its devices (read off the node's configuration, not chosen per
    claim)."""

    rdma_mode: RdmaMode = "exclusive"
    rdma_shared_holders: int = DEFAULT_SHARED_HOLDERS
    efa: bool = False  # offer EFA endpoints (driver `efa`) too
    # Which kinds this node offers at all: GPUs off lets fabricdra run beside NVIDIA's GPU DRA
    # driver (which then owns the GPUs) offering only NICs; discovery still reports everything.
    offer_gpus: bool = True
    offer_rdma: bool = True

    def __post_init__(self) -> None:
        if self.rdma_mode not in ("exclusive", "shared"):
            raise ValueError(f"rdma mode must be 'exclusive' or 'shared', not {self.rdma_mode!r}")
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
    # The GPUs this one reaches over NVLink inside the node (discovery/nvlink.py); None: none.
    nvlink_group: str | None = None
    mig_capacity: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


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
            nvlink_group=groups.get(bus),
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
    name: str
    type: DeviceType
    accelerator: Accelerator | None  # gpu: itself; mig: the parent GPU
    mig: MigDevice | None  # mig only
    endpoint: Endpoint | None  # rdma: the Interface (whole function) or the VirtualFunction
    interface: Interface | None  # rdma: the top-level Interface (the PF, for a VF)
    mode: EndpointMode | None  # rdma only
    health: Health
    health_reason: str | None
    info: GpuInfo | None = None  # gpu and mig: NVML's facts about the (parent) GPU
    # Unhealthy: the causes as short label-value tokens (`ecc`, `xid-79`, `link-down`), what
    # the device taint's value carries; the full text is `health_reason`.
    health_causes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceInventory:
    devices: tuple[Device, ...]
    # Holders per shared endpoint. Where the API cannot share one device between claims
    # (1.34/1.35, consumable capacity off), resourceslices.py publishes a shared endpoint as
    # this many holder devices `<name>-s<k>`; `get` resolves those names to the endpoint too.
    shared_holders: int = DEFAULT_SHARED_HOLDERS
    _by_name: dict[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Device] = {}
        for d in self.devices:
            if d.name in by_name:
                raise ValueError(f"two devices named {d.name!r}")
            by_name[d.name] = d
        object.__setattr__(self, "_by_name", by_name)

    def get(self, name: str) -> Device | None:
        """The device a ResourceSlice device name stands for: its own name, or for a shared
        endpoint one of its holder names (`<name>-s<k>`, k < shared_holders)."""
        found = self._by_name.get(name)
        if found is not None:
            return found
        m = _HOLDER.match(name)
        if m is None or int(m.group(2)) >= self.shared_holders:
            return None
        base = self._by_name.get(m.group(1))
        return base if base is not None and base.mode == "shared" else None

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)


def build_devices(
    interfaces: Sequence[Interface],
    accelerators: Sequence[Accelerator],
    config: DeviceConfig = DeviceConfig(),  # frozen: one shared default is safe
    gpu_health: Mapping[str, GpuHealth] | None = None,
    gpu_info: Mapping[str, GpuInfo] | None = None,
) -> DeviceInventory:
    """Every device this node offers, sorted by name (a stable order for slices and diffs)."""
    out: list[Device] = []
    if config.offer_gpus:
        for acc in accelerators:
            info = (gpu_info or {}).get(acc.pciBusId)
            out.extend(_accelerator_devices(acc, gpu_health or {}, info))
    if config.offer_rdma:
        for iface in interfaces:
            out.extend(_rdma_devices(iface, config))
    out.sort(key=lambda d: d.name)
    return DeviceInventory(tuple(out), shared_holders=config.rdma_shared_holders)


# --- accelerators -------------------------------------------------------------------------


def _accelerator_devices(
    acc: Accelerator, gpu_health: Mapping[str, GpuHealth], info: GpuInfo | None
) -> list[Device]:
    health, reason = _gpu_health(gpu_health.get(acc.pciBusId))
    causes = _gpu_causes(gpu_health.get(acc.pciBusId))
    if not acc.migMode:
        return [
            Device(
                name=dns_label("gpu", acc.pciBusId),
                type="gpu",
                accelerator=acc,
                mig=None,
                endpoint=None,
                interface=None,
                mode=None,
                health=health,
                health_reason=reason,
                info=info,
                health_causes=causes,
            )
        ]
    return [
        Device(
            name=_mig_name(acc, mig),
            type="mig",
            accelerator=acc,
            mig=mig,
            endpoint=None,
            interface=None,
            mode=None,
            health=health,
            health_reason=reason,
            info=info,
            health_causes=causes,
        )
        for mig in acc.migDevices
    ]


def _mig_name(acc: Accelerator, mig: MigDevice) -> str:
    if mig.gpuInstanceId is not None and mig.computeInstanceId is not None:
        return dns_label(
            "mig", acc.pciBusId, f"gi{mig.gpuInstanceId}", f"ci{mig.computeInstanceId}"
        )
    # Without instance ids the MIG UUID is the stable identity NVML offers.
    return dns_label("mig", mig.uuid.removeprefix("MIG-"))


def _gpu_health(reading: GpuHealth | None) -> tuple[Health, str | None]:
    if reading is None or reading.healthy is None:
        return "Unknown", (reading.reason if reading else None)
    if reading.healthy:
        return "Healthy", None
    return "Unhealthy", reading.reason or "unhealthy"


def _gpu_causes(reading: GpuHealth | None) -> tuple[str, ...]:
    return reading.causes if reading is not None and reading.healthy is False else ()


# --- RDMA endpoints ----------------------------------------------------------------------


def _rdma_devices(iface: Interface, config: DeviceConfig) -> list[Device]:
    if iface.driver == "efa" and not config.efa:
        return []
    if iface.sriovVfsConfigured or iface.virtualFunctions:
        # A PF with VFs configured serves the partitioned mode only: the node was put in that
        # state before we started, and offering the PF whole too would hand its link out twice.
        return [_rdma_device(vf, iface, "vf") for vf in iface.virtualFunctions if vf.rdmaDevice]
    if not iface.rdmaDevice:
        return []
    return [_rdma_device(iface, iface, config.rdma_mode)]


def _rdma_device(ep: Endpoint, iface: Interface, mode: EndpointMode) -> Device:
    health, reason = _link_health(ep)
    name = (
        dns_label("rdma", ep.pciBusId)
        if ep.pciBusId
        else dns_label("rdma", ep.rdmaDevice or ep.name or "unknown")
    )
    return Device(
        name=name,
        type="rdma",
        accelerator=None,
        mig=None,
        endpoint=ep,
        interface=iface,
        mode=mode,
        health=health,
        health_reason=reason,
        # The only Failed verdict discovery gives: every port of the link is down.
        health_causes=("link-down",) if health == "Unhealthy" else (),
    )


def _link_health(ep: Endpoint) -> tuple[Health, str | None]:
    if ep.link is None:
        return "Unknown", "no link verdict"
    if ep.link.verdict == "OK":
        return "Healthy", None
    if ep.link.verdict == "Failed":
        return "Unhealthy", ep.link.reason or "RDMA link failed"
    return "Unknown", ep.link.reason or "RDMA link unverified"


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
