"""Prepare and unprepare for `devices.fabricdra.io`: the `DraDriver` kubelet calls.

For each claim: read the ResourceClaim from the API (its UID must be the one kubelet named),
take the allocation results for this driver and this node's pool, resolve each device name
against the *current* `DeviceInventory`, and write one CDI spec for the claim:

- RDMA endpoint: its own verbs character device (`/dev/infiniband/uverbsN`, major/minor from
  the host's node). Once per claim, in a claim-level CDI device every RDMA device's ids
  include: `/dev/infiniband/rdma_cm` where the host has it, and `NCCL_IB_HCA` naming the
  granted RDMA devices, comma-joined. Never the whole /dev/infiniband folder.
- GPU / MIG instance: the NVIDIA container toolkit's own CDI id when its spec is on the host
  (driver libraries then come the supported way); otherwise the device nodes
  (`/dev/nvidiaN`, `/dev/nvidiactl`, UVM; for MIG also the instance's two capability nodes).
  An AMD GPU gets `/dev/kfd` and its own `/dev/dri/renderDN`.
  No NUMA or CPU settings are injected: a MIG slice or a shared GPU cannot honour them.

CDI device names are `<device>-<claim uid>` (`-<shareID>` added for a shared allocation):
unique per claim and across claims, and they start with a letter, so plain specs stay at
cdiVersion 0.3.0. The spec is rewritten only when its content changed; a repeated prepare
returns the same ids. The checkpoint records which spec files each claim created (written
before the spec, so a crash in between leaves nothing unknown), so unprepare removes exactly
those — also in a later process. Nothing else is recorded: responses come from the inventory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fabricdra.api.rest import CLAIMS, Rest

from .devices import Device, DeviceInventory
from .hostdevices import DeviceNodeError, HostLayout
from .kubelet import ClaimRef, PreparedDevice, PrepareError
from .kubelet.cdi import CdiDevice, CdiSpec, CdiWriter, ContainerEdits, DeviceNode
from .kubelet.checkpoint import Checkpoint, ClaimEntry
from .nvidiacdi import ToolkitSpecs

DRIVER_NAME = "devices.fabricdra.io"
NVIDIA, AMD = "0x10de", "0x1002"  # PCI vendor ids
CDI_KIND = "k8s.devices.fabricdra.io/device"


class ClaimReader(Protocol):
    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as JSON (`resource.k8s.io/v1`); raise when it cannot be read."""
        ...


class ApiClaimReader:
    """Reads claims from the API server as raw JSON, not the client's models (cheaper, and
    fields newer than the client library survive)."""

    def __init__(self, api: Any) -> None:
        self._rest = Rest(api)

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._rest.call("GET", CLAIMS.path(namespace, name), timeout=20.0)


@dataclass(frozen=True, slots=True)
class Grant:
    """One allocation result of this driver and pool, resolved against the inventory."""

    request: str  # base request name
    device: Device
    device_name: str  # as allocated (a shared holder name resolves to its endpoint)
    share_id: str | None


@dataclass
class DevicesDriver:
    """The `DraDriver` of devices.fabricdra.io (see the module docstring)."""

    node_name: str
    inventory: Callable[[], DeviceInventory]
    claims: ClaimReader
    cdi: CdiWriter
    checkpoint: Checkpoint
    host: HostLayout = field(default_factory=HostLayout)
    toolkit: ToolkitSpecs = field(default_factory=ToolkitSpecs)

    @property
    def driver_name(self) -> str:
        return DRIVER_NAME

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        obj = self.claims.read_claim(claim.namespace, claim.name)
        grants = self.grants(claim, obj)
        try:
            spec, prepared = self.build(claim, grants)
        except DeviceNodeError as e:
            raise PrepareError(str(e)) from None
        path = self.cdi.path_for(claim.uid)
        entry = ClaimEntry(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            cdi_specs=(str(path),) if spec is not None else (),
        )
        self.checkpoint.put(entry)  # first: a spec on disk is always one we know to remove
        if spec is not None:
            data = spec.to_dict()
            if _current(path) != data:
                self.cdi.write(claim.uid, spec)
        else:
            self.cdi.remove(claim.uid)
        return prepared

    def grants(self, claim: ClaimRef, obj: dict[str, Any]) -> list[Grant]:
        meta = obj.get("metadata") or {}
        if meta.get("uid") != claim.uid:
            raise PrepareError(
                f"ResourceClaim {claim.namespace}/{claim.name} has uid {meta.get('uid')}, "
                f"not {claim.uid}: it was deleted and recreated"
            )
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError("the claim is not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        ours = [r for r in results if r.get("driver") == self.driver_name]
        if not ours:
            raise PrepareError(f"the allocation has no devices of driver {self.driver_name}")
        inventory = self.inventory()
        grants = []
        for r in ours:
            pool, name = r.get("pool"), str(r.get("device"))
            if pool != self.node_name:
                raise PrepareError(
                    f"device {name} was allocated from pool {pool!r}, "
                    f"but this is node {self.node_name!r}"
                )
            device = inventory.get(name)
            if device is None:
                raise PrepareError(
                    f"device {name} (request {r.get('request')}) is not offered by this node "
                    "(not in its current inventory)"
                )
            if device.type == "rdma" and (
                device.endpoint is None or not device.endpoint.rdmaDevice
            ):
                raise PrepareError(f"device {name} names no RDMA endpoint")
            grants.append(
                Grant(
                    request=str(r.get("request", "")).split("/", 1)[0],
                    device=device,
                    device_name=name,
                    share_id=r.get("shareID"),
                )
            )
        return grants

    def build(
        self, claim: ClaimRef, grants: Sequence[Grant]
    ) -> tuple[CdiSpec | None, list[PreparedDevice]]:
        """The claim's CDI spec (None when every device uses the toolkit's ids) and the
        devices kubelet is told about, in allocation order."""
        cdi_devices: list[CdiDevice] = []
        prepared: list[PreparedDevice] = []
        hcas: list[str] = []
        common = f"rdma-{claim.uid}"
        rdma_ids: list[int] = []  # indexes into `prepared` that also get the claim-level id
        for g in grants:
            dev = g.device
            name = f"{g.device_name}-{claim.uid}" + (f"-{g.share_id}" if g.share_id else "")
            ids: list[str]
            if dev.type == "rdma":
                ep = dev.endpoint
                if ep is None or not ep.rdmaDevice:  # grants() refuses these already
                    raise PrepareError(f"device {g.device_name} names no RDMA endpoint")
                node = self.host.verbs_device(ep.rdmaDevice, ep.verbsDevice)
                cdi_devices.append(CdiDevice(name, ContainerEdits(device_nodes=(node,))))
                ids = [self.cdi.device_id(name)]
                if ep.rdmaDevice not in hcas:
                    hcas.append(ep.rdmaDevice)
                rdma_ids.append(len(prepared))
            else:
                toolkit_id, nodes = self._gpu(dev)
                if toolkit_id is not None:
                    ids = [toolkit_id]
                else:
                    cdi_devices.append(CdiDevice(name, ContainerEdits(device_nodes=tuple(nodes))))
                    ids = [self.cdi.device_id(name)]
            prepared.append(
                PreparedDevice(
                    pool_name=self.node_name,
                    device_name=g.device_name,
                    cdi_device_ids=tuple(ids),
                    request_names=(g.request,) if g.request else (),
                    share_id=g.share_id,
                )
            )
        if hcas:
            cm: tuple[DeviceNode, ...] = ()
            if self.host.has_char_device("/dev/infiniband/rdma_cm"):
                cm = (self.host.char_device("/dev/infiniband/rdma_cm"),)
            edits = ContainerEdits(env=(f"NCCL_IB_HCA={','.join(hcas)}",), device_nodes=cm)
            cdi_devices.append(CdiDevice(common, edits))
            for i in rdma_ids:  # the device's own id first: kubelet reports health by it
                p = prepared[i]
                prepared[i] = PreparedDevice(
                    p.pool_name,
                    p.device_name,
                    (*p.cdi_device_ids, self.cdi.device_id(common)),
                    p.request_names,
                    p.share_id,
                )
        spec = CdiSpec(kind=self.cdi.kind, devices=tuple(cdi_devices)) if cdi_devices else None
        return spec, prepared

    def _gpu(self, dev: Device) -> tuple[str | None, list[DeviceNode]]:
        acc = dev.accelerator
        if acc is None:
            raise PrepareError(f"device {dev.name} names no accelerator")
        if acc.vendorId == AMD and dev.type == "gpu":
            return None, self.host.amd_gpu_nodes(acc.pciBusId)
        if acc.vendorId != NVIDIA:
            raise PrepareError(
                f"device {dev.name}: {acc.vendor} accelerators cannot be prepared yet"
            )
        minor = self.host.nvidia_minor(acc.pciBusId)
        if dev.type == "gpu":
            toolkit = self.toolkit.gpu_id(acc.uuid, minor)
            return toolkit, [] if toolkit else self.host.nvidia_gpu_nodes(minor)
        mig = dev.mig
        if mig is None:
            raise PrepareError(f"device {dev.name} names no MIG instance")
        if mig.gpuInstanceId is None or mig.computeInstanceId is None:
            toolkit = self.toolkit.mig_id(mig.uuid)
            if toolkit is None:
                raise PrepareError(
                    f"MIG device {dev.name}: no GPU/compute instance ids and no toolkit CDI "
                    "spec naming its UUID"
                )
            return toolkit, []
        caps = self.host.mig_cap_nodes(minor, mig.gpuInstanceId, mig.computeInstanceId)
        toolkit = self.toolkit.mig_id(mig.uuid, [c.path for c in caps])
        if toolkit is not None:
            return toolkit, []
        return None, [*self.host.nvidia_gpu_nodes(minor), *caps]

    # -- unprepare -------------------------------------------------------------------------

    def unprepare(self, claim: ClaimRef) -> None:
        """Remove what this claim's prepare created; a claim never prepared is a success."""
        entry = self.checkpoint.get(claim.uid)
        if entry is not None:
            for spec in entry.cdi_specs:
                Path(spec).unlink(missing_ok=True)
        self.cdi.remove(claim.uid)  # the claim's own spec name, also without a checkpoint entry
        self.checkpoint.remove(claim.uid)


def _current(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
