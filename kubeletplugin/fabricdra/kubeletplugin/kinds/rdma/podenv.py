"""The RDMA family's pod-level environment (kinds/family.py `PodEnv`), moved out of prepare.py:

- NCCL_IB_HCA widened to every HCA of the pod's claims of this driver (ncclenv.py), the pods a
  claim is reserved for read for their PodGroup (KEP-5729);
- with --nccl-topo-file, a claim with a whole NVIDIA GPU: NCCL's XML topology of the pod's GPUs
  and NICs (nccltopo.py, nccltopofiles.py) mounted read-only, NCCL_TOPO_FILE pointing at it,
  through the claim-level `nccltopo-<claim uid>` CDI device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import structlog

from fabricdra.kube.rest import ApiError

from ...devices import Device, DeviceInventory
from ...discovery.sysfs import RootError, SysfsTree
from ...hostdevices import HostLayout
from ...kubelet import ClaimRef, PreparedDevice, PrepareError
from ...kubelet.cdi import CdiDevice, CdiSpec, CdiWriter
from ...kubelet.checkpoint import ClaimEntry
from ...kubelet.claims import api_timeout
from . import ncclenv, nccltopofiles
from .nccltopo import TopoDevice, TopologyError, render

# Logged as prepare's (the log lines are what operators grep for).
log = structlog.get_logger("fabricdra.prepare")


class PodReader(Protocol):
    def read_pod(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        """The Pod as JSON, in one attempt within `timeout` seconds; raise when it cannot be
        read."""
        ...


HcaOf = Callable[[Device], "str | None"]


@dataclass
class NcclClaim:
    """One claim's NCCL environment: its pods' groups (read before the lock), then the pod's
    HCA list and the claims to widen to it."""

    obj: dict[str, Any]
    pod_groups: dict[str, str | None]
    hca_of: HcaOf
    topo: nccltopofiles.TopoFiles | None
    _hcas: list[str] = field(default_factory=list)
    _companions: list[str] = field(default_factory=list)

    @property
    def consumers(self) -> tuple[str, ...]:
        return ncclenv.consumers(self.obj, self.pod_groups)

    def begin(
        self, entries: Sequence[ClaimEntry], claim_uid: str, devices: Sequence[Device]
    ) -> list[str]:
        own = [self.hca_of(d) for d in devices]
        hcas, companions = ncclenv.pod_hcas(entries, claim_uid, self.obj, own, self.pod_groups)
        self._hcas, self._companions = list(hcas), list(companions)
        return self._hcas

    def commit(self) -> None:
        ncclenv.widen_all(self._companions, self._hcas)  # before ours is recorded: see ncclenv

    def extend(
        self,
        claim: ClaimRef,
        devices: Sequence[Device],
        entries: Sequence[ClaimEntry],
        inventory: DeviceInventory,
        host: HostLayout,
        cdi: CdiWriter,
        spec: CdiSpec | None,
        prepared: list[PreparedDevice],
    ) -> tuple[CdiSpec | None, list[PreparedDevice]]:
        """With --nccl-topo-file: the NCCL topology of the pod's GPUs and NICs of this driver
        (nccltopofiles.py), written for this claim where it has a GPU and mounted by every
        device of it through one claim-level CDI device; the files of the prepared claims a
        pod of it may use with it rewritten to the same content. A fact NCCL requires that
        cannot be read leaves the claim without a file (NCCL then reads the host itself)."""
        topo = self.topo
        if topo is None:
            return spec, prepared
        own = [self._topo_device(d) for d in devices]
        ours = [d for d in own if d is not None]
        linked = ncclenv.companions(
            entries, claim.uid, ncclenv.consumers(self.obj, self.pod_groups)
        )
        widen = [e.uid for e in linked if topo.exists(e.uid)]
        if not nccltopofiles.has_gpu(ours) and not widen:
            return spec, prepared  # nothing to describe NCCL would use, nothing to widen
        pod = list(ours)
        for entry in linked:
            for r in entry.devices or ():
                device = inventory.get(r.base_name)
                d = self._topo_device(device) if device is not None else None
                if d is not None:
                    pod.append(d)
        try:
            tree = SysfsTree(host.sysfs_root)
            try:
                facts = nccltopofiles.pci_facts(tree, pod)
            finally:
                tree.close()
            text = render(pod, facts, nccltopofiles.cpu_facts(host.proc_root))
        except (TopologyError, ValueError, OSError, RootError) as e:
            log.warning("no NCCL topology file for the claim", claim=claim.name, reason=str(e))
            return spec, prepared
        try:
            for uid in widen:
                topo.write(uid, text)
            if not nccltopofiles.has_gpu(ours):
                return spec, prepared
            topo.write(claim.uid, text)
        except OSError as e:
            raise PrepareError(f"cannot write the NCCL topology file: {e}") from None
        name = nccltopofiles.device_name(claim.uid)
        cdi_devices = [
            *(spec.devices if spec is not None else ()),
            CdiDevice(name, topo.edits(claim.uid)),
        ]
        topo_id = cdi.device_id(name)
        out = [replace(p, cdi_device_ids=(*p.cdi_device_ids, topo_id)) for p in prepared]
        return CdiSpec(kind=cdi.kind, devices=tuple(cdi_devices)), out

    def _topo_device(self, device: Device) -> TopoDevice | None:
        return nccltopofiles.topo_device(device, self.hca_of(device))


class NcclPodEnv:
    """The RDMA family's `PodEnv`. `pods`: reads the pods an RDMA claim is reserved for, for
    their PodGroup (None: no PodGroup links are made); `topo_dir`: --nccl-topo-file's folder
    (None: no topology files)."""

    def __init__(self, pods: PodReader | None, topo_dir: Path | None, hca_of: HcaOf) -> None:
        self._pods = pods
        self._hca_of = hca_of
        self._topo = nccltopofiles.TopoFiles(topo_dir) if topo_dir is not None else None

    def start(self, claims: Iterable[str]) -> None:
        if self._topo is not None:
            self._topo.keep_only(claims)

    def remove(self, claim_uid: str) -> None:
        if self._topo is not None:
            self._topo.remove(claim_uid)

    def read(self, obj: dict[str, Any], devices: Sequence[Device]) -> NcclClaim:
        return NcclClaim(obj, self._pod_groups(obj, devices), self._hca_of, self._topo)

    def _pod_groups(self, obj: dict[str, Any], devices: Sequence[Device]) -> dict[str, str | None]:
        """The PodGroup (`spec.schedulingGroup.podGroupName`, KEP-5729) of each pod an RDMA
        claim is reserved for: pod name -> group name, None when the pod is in none. Only a
        claim with an RDMA device carries an NCCL_IB_HCA list, so only such a claim's pods are
        read; a pod that cannot be read fails the prepare (kubelet retries) rather than leave
        a group's claim out of the pod's list."""
        if self._pods is None:
            return {}
        pods = ncclenv.reserved_pods(obj)
        if not pods or not any(self._hca_of(d) for d in devices):
            return {}
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        out: dict[str, str | None] = {}
        for r in pods:
            name = str(r.get("name", ""))
            try:
                pod = self._pods.read_pod(namespace, name, api_timeout())
            except ApiError as e:
                raise PrepareError(
                    f"cannot read pod {namespace}/{name} (the claim is reserved for it) "
                    f"for its PodGroup: {e}"
                ) from None
            group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
            out[name] = str(group) if group else None
        return out
