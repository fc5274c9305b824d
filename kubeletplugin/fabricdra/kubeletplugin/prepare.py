"""Prepare and unprepare for `devices.fabricdra.io`: the `DraDriver` kubelet calls.

For each claim: read the ResourceClaim from the API (its UID must be the one kubelet named),
take the allocation results for this driver and this node's pool, resolve each device name
against the *current* `DeviceInventory`, and write one CDI spec for the claim:

- RDMA endpoint: its own verbs character device (`/dev/infiniband/uverbsN`, major/minor from
  the host's node). Once per *claim*, in a claim-level CDI device every RDMA device of the
  claim includes: `/dev/infiniband/rdma_cm` where the host has it, and
  `NCCL_IB_HCA==<the claim's RDMA devices>` (the leading `=` makes NCCL match names exactly,
  so `mlx5_1` never also selects `mlx5_10`), widened to every HCA of the pod's other claims
  of this driver: one list wherever it appears, so no order of applying CDI devices leaves a
  container with fewer HCAs than it was given (see `kinds/rdma/ncclenv.py`). Never the whole
  /dev/infiniband folder.
- GPU / MIG instance: the NVIDIA container toolkit's own CDI id when its spec is on the host
  (driver libraries then come the supported way); otherwise the device nodes
  (`/dev/nvidiaN`, `/dev/nvidiactl`, UVM; for MIG also the instance's two capability nodes)
  and nothing else: no driver libraries (the image brings its own). An AMD GPU gets
  `/dev/kfd` and its own `/dev/dri/renderDN`. Every GPU or MIG grant also includes the
  claim's `gpus-<claim uid>` CDI device, which sets `NVIDIA_VISIBLE_DEVICES=void`, so a
  legacy-mode nvidia-container-runtime never honours an image's `NVIDIA_VISIBLE_DEVICES=all`
  and injects GPUs nobody was granted. A container given only NICs never gets it: the GPUs
  NVIDIA's device plugin (env mode) gave the same container stay.
  No NUMA or CPU settings are injected: a MIG slice or a shared GPU cannot honour them.
- With --nccl-topo-file (default on), a claim with a whole NVIDIA GPU: NCCL's XML topology of
  the pod's GPUs and NICs (kinds/rdma/: nccltopo.py, nccltopofiles.py, podenv.py) mounted
  read-only, NCCL_TOPO_FILE pointing at it, through the claim-level `nccltopo-<claim uid>`
  CDI device.

Refusals (the driver is the last line of defence): a device that overlaps one another
prepared claim holds — the same device, a GPU and its MIG instances, a PF and its VFs — unless
both are shares of a device offered shared or either request has admin access, a share of a
device not offered shared, and a share of a shared GPU whose consumed capacity does not fit
beside the shares already prepared on it (exclusivity.py, gpusharing.py); opaque
configuration addressed to this driver other than a `GpuConfig` sharing strategy it can honour
(gpusharing.py: MPS adds a `sharing-<device>-<claim>` CDI device); anything not offered by this
node, or a GPU that left the PCI bus.

Never stalling kubelet (the shared rules of `kubelet/claims.py`): the claim is read before any
lock, in one attempt, within `READ_BUDGET` and at least `DEADLINE_MARGIN` before kubelet's
deadline; a call kubelet has cancelled or given up on stops before it writes anything.

CDI device names are `<device>-<claim uid>` (`-<shareID>` added for a shared allocation):
unique per claim and across claims, and they start with a letter, so plain specs stay at
cdiVersion 0.3.0. The spec is rewritten only when its content changed. The checkpoint records,
before the spec is written, the spec file and the devices kubelet is told (so a crash leaves
nothing unknown); a repeated prepare returns exactly those, without reading the API or
re-resolving against an inventory that may have changed since. Unprepare removes exactly
what was recorded — also in a later process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import structlog

from fabricdra.kube import events
from fabricdra.kube.events import ObjectRef, Reporter
from fabricdra.kube.rest import CLAIMS, EVENTS, PODS, ApiError

from . import devicemetadata, exclusivity, kinds, metrics
from .devicemetadata import Granted, MetadataFiles
from .devices import Device, DeviceConfig, DeviceInventory
from .hostdevices import DeviceNodeError, HostLayout
from .kinds import ClaimGroup, PrepareContext
from .kinds.family import ClaimHooks, OpaqueConfigs, OpaqueSetting, PodClaim, PodEnv
from .kubelet import ClaimRef, PreparedDevice, PrepareError
from .kubelet.cdi import CdiDevice, CdiSpec, CdiWriter
from .kubelet.checkpoint import Checkpoint, ClaimEntry, PreparedRecord
from .kubelet.claims import (
    ClaimReader,
    drop_other_boots,
    ensure_wanted,
    read_claim,
    recorded_answer,
    remove_recorded_specs,
)
from .networkstatus import NetworkStatus

log = structlog.get_logger("fabricdra.prepare")


DRIVER_NAME = "devices.fabricdra.io"
CDI_KIND = "k8s.devices.fabricdra.io/device"

EVENT_BUDGET = 4.0  # seconds the advisory events of one prepare may take


class EventRecorder(Protocol):
    def warn(self, claim: dict[str, Any], reason: str, message: str, timeout: float) -> None:
        """Record a Warning event about the ResourceClaim `claim` (best effort, one attempt
        within `timeout` seconds)."""
        ...


# Reads the pods a claim is reserved for (the RDMA family's PodGroup links).
PodReader = kinds.PodReader


class ApiClaimReader:
    """Reads claims from the API server as raw JSON, not the client's models (cheaper, and
    fields newer than the client library survive), and records events about them."""

    def __init__(self, api: Any) -> None:
        # Claim reads are not writes; the events are, counted with the publisher's.
        self._rest = metrics.counting_rest(api)

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        # No retries: urllib3's default of 3 would make the timeout up to 4x as long.
        return self._rest.call("GET", CLAIMS.path(namespace, name), timeout=timeout, retries=False)

    def read_pod(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return self._rest.call("GET", PODS.path(namespace, name), timeout=timeout, retries=False)

    def warn(self, claim: dict[str, Any], reason: str, message: str, timeout: float) -> None:
        meta = claim.get("metadata") or {}
        body = events.event(
            ObjectRef(
                CLAIMS.api_version,
                "ResourceClaim",
                str(meta.get("name")),
                meta.get("namespace"),
                meta.get("uid"),
            ),
            Reporter("fabricdra-kubelet-plugin"),
            type="Warning",
            reason=reason,
            message=message,
            namespace=meta.get("namespace"),
        )
        try:
            self._rest.create(EVENTS, body, meta.get("namespace"), timeout=timeout, retries=False)
        except ApiError as e:  # an event is advice: never fail a prepare over it
            log.warning("cannot record event", reason=reason, error=str(e))


@dataclass(frozen=True, slots=True)
class Grant:
    """One allocation result of this driver and pool, resolved against the inventory."""

    request: str  # base request name
    device: Device
    device_name: str  # as allocated (a shared holder name resolves to its endpoint)
    share_id: str | None
    admin_access: bool = False
    # A share of a shared GPU: what it consumes (its kind's `consumed`); None otherwise.
    consumed: dict[str, int] | None = None
    # The claim's opaque setting for this device (NVIDIA: a GpuConfig sharing strategy);
    # None: none set.
    sharing: OpaqueSetting | None = None


@dataclass
class DevicesDriver:
    """The `DraDriver` of devices.fabricdra.io (see the module docstring)."""

    node_name: str
    inventory: Callable[[], DeviceInventory]
    claims: ClaimReader
    cdi: CdiWriter
    checkpoint: Checkpoint
    host: HostLayout = field(default_factory=HostLayout)
    # Each device family's part in a prepare (kinds/family.py ClaimHooks; families.py builds
    # them): what its kinds are lent, its begin -> undo, its opaque configuration.
    families: Sequence[ClaimHooks] = ()
    events: EventRecorder | None = None
    # status.devices[].networkData of granted RDMA netdevs (networkstatus.py); None: not written.
    network: NetworkStatus | None = None
    # How this node offers its devices: kinds whose container edits depend on it read it.
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    # Reads the pods an RDMA claim is reserved for, for their PodGroup (KEP-5729:
    # kinds/rdma/ncclenv.py); None: no PodGroup links are made.
    pods: PodReader | None = None
    # --device-metadata (KEP-5304): where each request's metadata file is written on the host
    # (devicemetadata.py); None: no metadata for containers.
    metadata_dir: Path | None = None
    # --nccl-topo-file: where each GPU claim's NCCL topology (NCCL_TOPO_FILE) is written on the
    # host (kinds/rdma/nccltopofiles.py); None: none written.
    nccl_topo_dir: Path | None = None
    # Reads happen outside the lock; resolving, the in-use check and writing inside it.
    locks_itself = True
    _metadata: MetadataFiles | None = field(default=None, init=False, repr=False)
    # Each family's part in the environment a pod shares across its claims (kinds.pod_envs,
    # from `pods` and `nccl_topo_dir`).
    _pod_envs: tuple[PodEnv, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        # Entries of another boot: their containers are gone; so must their spec files be
        # (only inside our own CDI folder, whatever the checkpoint names).
        drop_other_boots(self.checkpoint, self.cdi)
        if self.metadata_dir is not None:
            self._metadata = MetadataFiles(self.metadata_dir, DRIVER_NAME)
            self._metadata.keep_only(e.uid for e in self.checkpoint.entries())
        self._pod_envs = kinds.pod_envs(self.pods, self.nccl_topo_dir)
        for env in self._pod_envs:
            env.start([e.uid for e in self.checkpoint.entries()])

    @property
    def driver_name(self) -> str:
        return DRIVER_NAME

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        done = self._already_prepared(claim)
        if done is not None:
            return done
        obj = read_claim(self.claims, claim)  # before any lock: one slow read delays no one
        pod = self._read_pod_envs(obj)  # also before the lock
        # The file lock too: another agent pod may serve kubelet during a rolling update.
        with self.checkpoint.exclusive():  # serializes our threads too, boundedly
            ensure_wanted()
            done = self._already_prepared(claim)  # a concurrent call for the same claim
            if done is not None:
                return done
            grants = self.grants(claim, obj)
            self._refuse_in_use(claim, grants)
            devices = [g.device for g in grants]
            hcas: list[str] = []
            for p in pod:
                hcas = p.begin(self.checkpoint.entries(), claim.uid, devices) or hcas
            undo = [f.begin(claim.uid, [g.device for g in grants]) for f in self.families]
            try:
                try:
                    with ExitStack() as serving:
                        for f in self.families:
                            serving.enter_context(f.serving())
                        spec, prepared = self.build(claim, grants, hcas)
                except DeviceNodeError as e:
                    raise PrepareError(str(e)) from None
                spec, prepared = self._with_metadata(claim, obj, grants, spec, prepared)
                inventory = self.inventory()
                for p in pod:
                    spec, prepared = p.extend(
                        claim,
                        devices,
                        self.checkpoint.entries(),
                        inventory,
                        self.host,
                        self.cdi,
                        spec,
                        prepared,
                    )
                for p in pod:
                    p.commit()  # before ours is recorded: see kinds/rdma/ncclenv.py
                self._record(claim, grants, spec, prepared, pod)
            except Exception:
                if self._metadata is not None:
                    self._metadata.remove(claim.uid)
                for env in self._pod_envs:
                    env.remove(claim.uid)
                # Nothing half-made (NVIDIA: MIG instances this call created); kubelet retries.
                for u in undo:
                    u()
                raise
        if self.network is not None:
            self.network.write(claim.namespace, claim.name, grants)
        return prepared

    def _read_pod_envs(self, obj: dict[str, Any]) -> list[PodClaim]:
        """Before the lock: each family's read of what the claim's pod shares (RDMA: the
        PodGroup of each pod it is reserved for), given the claim's devices of this driver and
        node in the current inventory."""
        if not self._pod_envs:
            return []
        results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        inventory = self.inventory()
        devices = []
        for r in results:
            if r.get("driver") != self.driver_name or r.get("pool") != self.node_name:
                continue
            device = inventory.get(str(r.get("device")))
            if device is not None:
                devices.append(device)
        return [env.read(obj, devices) for env in self._pod_envs]

    def _with_metadata(
        self,
        claim: ClaimRef,
        obj: dict[str, Any],
        grants: Sequence[Grant],
        spec: CdiSpec | None,
        prepared: list[PreparedDevice],
    ) -> tuple[CdiSpec | None, list[PreparedDevice]]:
        """With --device-metadata (KEP-5304): each request's metadata file written, and one
        CDI device per request that mounts it, included by every device of the request."""
        if self._metadata is None:
            return spec, prepared
        by_request: dict[str, list[Granted]] = {}
        for g in grants:
            by_request.setdefault(g.request, []).append(Granted(g.device_name, g.device))
        devices = list(spec.devices) if spec is not None else []
        ids: dict[str, str] = {}
        for request, granted in by_request.items():
            doc = devicemetadata.document(DRIVER_NAME, self.node_name, obj, request, granted)
            self._metadata.write(claim.uid, request, doc)
            name = devicemetadata.device_name(request, claim.uid)
            devices.append(CdiDevice(name, self._metadata.edits(obj, claim.uid, request)))
            ids[request] = self.cdi.device_id(name)
        out = [
            replace(p, cdi_device_ids=(*p.cdi_device_ids, ids[p.request_names[0]]))
            if p.request_names and p.request_names[0] in ids
            else p
            for p in prepared
        ]
        return CdiSpec(kind=self.cdi.kind, devices=tuple(devices)), out

    def _already_prepared(self, claim: ClaimRef) -> list[PreparedDevice] | None:
        """The recorded answer of an earlier prepare of this claim (same UID), while every
        spec file it wrote is still there; None: prepare it (again)."""
        return recorded_answer(self.checkpoint, claim.uid, self.node_name)

    def _record(
        self,
        claim: ClaimRef,
        grants: Sequence[Grant],
        spec: CdiSpec | None,
        prepared: Sequence[PreparedDevice],
        pod: Sequence[PodClaim] = (),
    ) -> None:
        path = self.cdi.path_for(claim.uid)
        consumers = next((p.consumers for p in pod if p.consumers), ())
        entry = ClaimEntry(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            cdi_specs=(str(path),) if spec is not None else (),
            devices=tuple(
                PreparedRecord(
                    device_name=p.device_name,
                    base_name=g.device.name,
                    cdi_device_ids=p.cdi_device_ids,
                    request_names=p.request_names,
                    share_id=p.share_id,
                    admin_access=g.admin_access,
                    within=exclusivity.within(g.device),
                    consumed=None if g.consumed is None else tuple(sorted(g.consumed.items())),
                )
                for g, p in zip(grants, prepared, strict=True)
            ),
            consumers=consumers,
        )
        before = self.checkpoint.get(claim.uid)
        self.checkpoint.put(entry)  # first: a spec on disk is always one we know to remove
        try:
            if spec is not None:
                if _current(path) != spec.to_dict():
                    self.cdi.write(claim.uid, spec)
            else:
                self.cdi.remove(claim.uid)
        except BaseException:
            # Nothing half-prepared holds devices: back to what was recorded before.
            if before is None:
                self.checkpoint.remove(claim.uid)
            else:
                self.checkpoint.put(before)
            raise

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
        devices = allocation.get("devices") or {}
        results = devices.get("results") or []
        ours = [r for r in results if r.get("driver") == self.driver_name]
        if not ours:
            raise PrepareError(f"the allocation has no devices of driver {self.driver_name}")
        sharing = self._opaque_settings(devices.get("config") or [], ours)
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
            if kinds.kind_of(device).gone(device):
                raise PrepareError(
                    f"device {name} (request {r.get('request')}) is no longer on the PCI bus "
                    "(it fell off the bus; published, tainted, until the agent restarts): "
                    "nothing to hand over"
                )
            request = str(r.get("request", "")).split("/", 1)[0]
            strategy = sharing.get(request)
            if strategy is not None:
                strategy[1].check(device, name, request)
            share_id = r.get("shareID")
            grants.append(
                Grant(
                    request=request,
                    device=device,
                    device_name=name,
                    share_id=share_id,
                    admin_access=bool(r.get("adminAccess")),
                    consumed=kinds.kind_of(device).consumed(device, r)
                    if share_id is not None
                    else None,
                    sharing=strategy[0] if strategy is not None else None,
                )
            )
        return grants

    def _opaque_settings(
        self, config: Sequence[Any], ours: Sequence[dict[str, Any]]
    ) -> dict[str, tuple[OpaqueSetting, OpaqueConfigs]]:
        """The opaque setting of each request (NVIDIA: a `GpuConfig` sharing strategy,
        gpusharing.py), with the family's configs that parsed it; a later entry beats an
        earlier one (the API lists the class's, then the claim's). Anything addressed to this
        driver that no family takes is a mistake the user must hear about, not something to
        ignore."""
        requests = {str(r.get("request", "")).split("/", 1)[0] for r in ours}
        out: dict[str, tuple[OpaqueSetting, OpaqueConfigs]] = {}
        configs = next((f.opaque for f in self.families if f.opaque is not None), None)
        for c in config:
            opaque = (c or {}).get("opaque") or {}
            if opaque.get("driver") != self.driver_name:
                continue
            applies = [str(x).split("/", 1)[0] for x in c.get("requests") or []]
            if applies and not requests.intersection(applies):
                continue
            try:
                if configs is None:
                    raise PrepareError("this driver takes no opaque configuration")
                strategy = configs.parse(opaque.get("parameters"))
            except PrepareError as e:
                raise PrepareError(
                    f"opaque configuration for driver {self.driver_name} (source "
                    f"{c.get('source', '?')}, requests {applies or 'all'}): {e}; fix or remove "
                    "it from the claim or its DeviceClass"
                ) from None
            for request in applies or requests:
                if strategy is None or configs is None:
                    out.pop(request, None)
                else:
                    out[request] = (strategy, configs)
        return out

    def _refuse_in_use(self, claim: ClaimRef, grants: Sequence[Grant]) -> None:
        """The checkpoint says which claims hold which devices: a device that would overlap
        another claim's (or this claim's) in a way the node did not offer is refused
        (exclusivity.py has the rule)."""
        wanted = [
            exclusivity.grant_hold(g.device, g.device_name, g.share_id, g.admin_access)
            for g in grants
        ]
        conflict = exclusivity.find_conflict(claim.uid, wanted, self.checkpoint.entries())
        if conflict is not None:
            g = grants[conflict.index]
            label = f"{g.device_name} (request {g.request})"
            raise PrepareError(conflict.reason(wanted[conflict.index], label))
        uses = [(g.device, w, g.consumed) for g, w in zip(grants, wanted, strict=True)]
        over = exclusivity.find_over_capacity(claim.uid, uses, self.checkpoint.entries())
        if over is not None:
            g = grants[over[0]]
            raise PrepareError(
                f"device {g.device_name} (request {g.request}) was allocated as a share, but "
                f"{over[1]}: refusing what the GPU cannot honour"
            )

    def build(
        self, claim: ClaimRef, grants: Sequence[Grant], hcas: Sequence[str] | None = None
    ) -> tuple[CdiSpec | None, list[PreparedDevice]]:
        """The claim's CDI spec (None when every device uses the toolkit's ids) and the
        devices kubelet is told about, in allocation order. Each device's kind says how it is
        served (kinds/). `hcas`: the names the claim's NCCL_IB_HCA selects (default: its own
        RDMA devices)."""
        cdi_devices: list[CdiDevice] = []
        prepared: list[PreparedDevice] = []
        own_hcas: list[str] = []
        used: list[ClaimGroup] = []
        ctx = PrepareContext(
            claim.uid,
            self.host,
            config=self.devices,
            rail_aligned=rail_aligned([g.device for g in grants]),
        )
        for f in self.families:
            ctx = f.lend(ctx)
        for g in grants:
            dev = g.device
            kind = kinds.kind_of(dev)
            name = f"{g.device_name}-{claim.uid}" + (f"-{g.share_id}" if g.share_id else "")
            served = kind.serve(dev, ctx)
            # The device's own id first (kubelet reports health by it), then the claim-level one.
            ids: list[str]
            if served.toolkit_id is not None:
                ids = [served.toolkit_id]
            else:
                cdi_devices.append(CdiDevice(name, served.edits))
                ids = [self.cdi.device_id(name)]
            if served.group is not None:
                ids.append(self.cdi.device_id(served.group.device_name(claim.uid)))
                if served.group not in used:
                    used.append(served.group)
            if g.sharing is not None:
                edits = g.sharing.edits(sum(1 for x in grants if x.sharing == g.sharing))
                if not edits.empty():
                    cdi_devices.append(CdiDevice(f"sharing-{name}", edits))
                    ids.append(self.cdi.device_id(f"sharing-{name}"))
            hca = kind.nccl_hca(dev)
            if hca:
                own_hcas.append(hca)
            prepared.append(
                PreparedDevice(
                    pool_name=self.node_name,
                    device_name=g.device_name,
                    cdi_device_ids=tuple(ids),
                    request_names=(g.request,) if g.request else (),
                    share_id=g.share_id,
                )
            )
        for group in kinds.CLAIM_GROUPS:  # a fixed order: the spec does not follow the grants
            if group in used:
                edits = group.edits(ctx, own_hcas, hcas or ())
                cdi_devices.append(CdiDevice(group.device_name(claim.uid), edits))
        spec = None
        if cdi_devices:
            spec = CdiSpec(kind=self.cdi.kind, devices=tuple(cdi_devices))
        return spec, prepared

    # -- unprepare -------------------------------------------------------------------------

    def unprepare(self, claim: ClaimRef) -> None:
        """Remove what this claim's prepare created; a claim never prepared is a success."""
        with self.checkpoint.exclusive():  # serializes our threads too, boundedly
            entry = self.checkpoint.get(claim.uid)
            if entry is not None:
                remove_recorded_specs(entry, self.cdi)
            self.cdi.remove(claim.uid)  # its own spec name, also without a checkpoint entry
            if self._metadata is not None:
                self._metadata.remove(claim.uid)
            for env in self._pod_envs:
                env.remove(claim.uid)
            names = [r.device_name for r in (entry.devices or [])] if entry else None
            for f in self.families:
                f.release(claim.uid, names)
            self.checkpoint.remove(claim.uid)


def _current(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def rail_aligned(devices: Sequence[Device]) -> bool:
    """At least one NCCL NIC granted, and every one with a measured rail (a VF: its PF's)."""
    nics = [d for d in devices if kinds.kind_of(d).nccl_hca(d)]
    if not nics:
        return False
    for d in nics:
        port = kinds.kind_of(d).port(d)
        record = port.scaleOut if port is not None else None
        if record is None or record.rail is None or record.railSource != "measured":
            return False
    return True
