"""The `compute-domain.fabricdra.io` kubelet driver (a `DraDriver` for the shared plugin server).

prepare(claim), in two phases (the shared rules of `kubelet/claims.py`), after one check:
0. a claim the checkpoint says was prepared (its spec still there) is answered from the
   checkpoint: no API read, no IMEX wait (a repeat from kubelet while IMEX restarts);
1. reads the claim (before any lock, one attempt, within `api_timeout()`) and finds its
   results on this node (`channel` or `daemon` device) and the opaque configuration the
   controller put in the claim template (domain, channel);
2. checks, before touching anything: the claim's namespace is the domain's (workload claims),
   the domain exists with that UID, the channel in the claim is the one the domain holds, the
   host can provide the channel (major in /proc/devices), and that IMEX on this node is READY
   (managed mode: this node's row in the domain's status is ready, i.e. its IMEX daemon
   reported READY, wherever the row or the node's label names an NVLink fabric domain; host
   mode: the host's IMEX service answers READY). IMEX not ready yet is
   waited for, up to `imex_wait_seconds` and never past kubelet's deadline (less a margin to
   answer), outside any lock, and no longer once kubelet has gone; then the claim fails with
   a clear error and kubelet retries it. Every read and wait happens here, so a slow claim
   never delays another (the driver `locks_itself`; the server calls it concurrently). The
   node's fabric label is read once here, also for daemon claims (their environment);
3. under the checkpoint's lock (waited for within kubelet's deadline), only if kubelet still
   waits: refuses a claim of another ComputeDomain than the one the node's other prepared
   claims belong to, or for a channel one of them holds (read from their CDI specs,
   `_held_by_others`), creates the host channel device node if missing, records the claim in
   the checkpoint, then writes its CDI spec (atomic).

Prepare is idempotent: the same claim gives the same devices and CDI ids every time (recorded
in its checkpoint entry).
unprepare(claim) removes exactly what the checkpoint says the claim created (spec files only
inside this driver's CDI folder). The checkpoint records the boot: entries of another boot are
dropped at start-up with their specs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.api.jsontypes import JSON
from fabricdra.api.opaque import OpaqueConfigError, parse_opaque
from fabricdra.kube.rest import COMPUTE_DOMAINS, NODES, ApiError, Rest
from fabricdra.kubeletplugin.kubelet import ClaimRef, PreparedDevice, PrepareError
from fabricdra.kubeletplugin.kubelet.cdi import (
    CdiDevice,
    CdiSpec,
    CdiWriter,
    ContainerEdits,
    DeviceNode,
    Mount,
)
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint, ClaimEntry, PreparedRecord
from fabricdra.kubeletplugin.kubelet.claims import (
    POLL_SECONDS,
    RestClaimReader,
    api_timeout,
    drop_other_boots,
    ensure_wanted,
    read_claim,
    recorded_answer,
    remove_recorded_specs,
    wait_until,
)

from .channels import CHANNEL_DIR, ChannelError, ChannelNode, ensure_host_node, imex_major
from .hostimex import HostImexCheck
from .imexfiles import imex_injection

log = logging.getLogger("fabricdra.compute-domain-plugin")

CDI_KIND = "fabricdra.io/compute-domain"
# The env our specs give a container (below): which domain it belongs to, and its channel.
DOMAIN_ENV = ("FABRICDRA_COMPUTE_DOMAIN_UID", "FABRICDRA_DOMAIN_UID")  # channel, daemon
CHANNEL_ENV = "FABRICDRA_IMEX_CHANNEL"


@dataclass(frozen=True)
class Held:
    """What one device of another claim's prepared spec holds on this node."""

    entry: ClaimEntry
    domain: str  # the ComputeDomain UID
    channels: frozenset[int]


def _held(entry: ClaimEntry, edits: JSON) -> Held:
    env = dict(str(e).partition("=")[::2] for e in edits.get("env") or [])
    domain = next((env[k] for k in DOMAIN_ENV if env.get(k)), "")
    channels = {int(env[CHANNEL_ENV])} if env.get(CHANNEL_ENV, "").isdigit() else set()
    # Every channel device node it was given ("All" mode gives all of them).
    prefix = f"/dev/{CHANNEL_DIR}/channel"
    for node in edits.get("deviceNodes") or []:
        path = str(node.get("path", ""))
        if path.startswith(prefix) and path[len(prefix) :].isdigit():
            channels.add(int(path[len(prefix) :]))
    return Held(entry, domain, frozenset(channels))


def _refuse_held(claim: ClaimRef, params: JSON, held: list[Held], node: str) -> None:
    """One ComputeDomain per node, and never one IMEX channel for two domains, as the node's
    checkpoint shows it (NVIDIA's driver checks the same from its node-local checkpoint):
    backs the controller's holds, which can only follow what the API shows."""
    uid = str(params["domainUID"])
    want: set[int] = set()
    if params["kind"] == cd.OPAQUE_KIND:
        all_ = params.get("allocationMode") == "All"
        want = set(range(cd.CHANNEL_COUNT)) if all_ else {int(params["channel"])}
    for h in held:
        if h.domain == uid:
            continue  # the domain's own claims share its node and its channel
        holder = (
            f"claim {h.entry.namespace}/{h.entry.name} (uid {h.entry.uid}) of ComputeDomain "
            f"{h.domain or '(unknown)'}, prepared on node {node} and not unprepared yet"
        )
        if shared := want & h.channels:
            raise PrepareError(
                f"claim {claim}: IMEX channel {min(shared)} is held by {holder}; two "
                "ComputeDomains never share a channel (kubelet retries once it is released)"
            )
        raise PrepareError(
            f"claim {claim} of ComputeDomain {uid}: node {node} is held by {holder}; one "
            "ComputeDomain per node (kubelet retries once it is released)"
        )


@dataclass(frozen=True)
class NodeConfig:
    node_name: str
    cdi_dir: Path
    plugin_dir: Path  # checkpoint and per-domain daemon folders live here
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/dev")
    fabric_domain: str = ""  # this node's fabricdra.io/fabric.domain ("" = no NVLink fabric)
    # Read the node's fabricdra.io/fabric.domain label at each use instead of `fabric_domain`
    # (the plugin: on a fresh node the devices agent sets it only after its first pass).
    fabric_from_node: bool = False
    imex_ctl: str = "nvidia-imex-ctl"  # host mode: the host IMEX service's control tool
    imex_ctl_args: tuple[str, ...] = field(default=("-q",))
    # Host mode: the host IMEX service's command socket as this plugin sees it (the chart
    # mounts its folder); None: the tool's own default (hostimex.py).
    host_imex_socket: Path | None = None
    imex_wait_seconds: float = 20.0  # how long prepare waits for IMEX to become READY
    imex_poll_seconds: float = POLL_SECONDS  # between two looks at the domain's status
    driver_root: Path = Path("/")  # host path of the NVIDIA driver install (CDI mount source)
    driver_root_view: Path | None = None  # where this plugin sees it (None: driver_root)
    boot_id: str | None = None  # this boot (checkpoint entries of another are dropped)
    # The driver's own namespace: the controller makes the IMEX daemons' claims there and
    # nowhere else, so a daemon claim from any other namespace is refused (see _domain).
    daemon_namespace: str = "fabricdra-system"


class ComputeDomainDriver:
    # API reads and the IMEX wait happen outside the lock; only writing is serialized (by the
    # checkpoint's lock, waited for within kubelet's deadline).
    locks_itself = True

    def __init__(self, rest: Rest, config: NodeConfig) -> None:
        self.rest = rest
        self.claims = RestClaimReader(rest)
        self.config = config
        self.cdi = CdiWriter(config.cdi_dir, CDI_KIND)
        config.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = Checkpoint(config.plugin_dir / "checkpoint.json", boot_id=config.boot_id)
        drop_other_boots(self.checkpoint, self.cdi)

    @property
    def driver_name(self) -> str:
        return cd.DRIVER

    # -- prepare -------------------------------------------------------------------------
    def prepare(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        # A repeat (kubelet restarted, or another pod shares the claim): the recorded answer,
        # with no API read and no IMEX wait (IMEX may be restarting under a running workload).
        answer = recorded_answer(self.checkpoint, claim.uid, self.config.node_name)
        if answer is not None:
            return answer
        # Phase 1, no lock: every API read and wait (a slow claim holds up no other).
        obj = read_claim(self.claims, claim)
        results = self._results(obj)
        if not results:
            raise PrepareError(
                f"claim {claim} has no {cd.DRIVER} device on node {self.config.node_name}"
            )
        fabric = self.fabric_domain()  # read once, here: the edits below read nothing
        wait_until(
            lambda: self._imex_state(claim, obj, fabric),
            self.config.imex_wait_seconds,
            poll=self.config.imex_poll_seconds,
        )
        checked = []
        for result in results:
            if result["device"] not in (cd.CHANNEL_DEVICE, cd.DAEMON_DEVICE):
                raise PrepareError(f"claim {claim}: unknown device {result['device']!r}")
            params = self._params(obj, result)
            checked.append((result, params, self._domain(claim, params)))
        # Phase 2: local writes only, under the checkpoint's lock (it serializes this
        # process's threads too; waited for within kubelet's deadline), for a kubelet that
        # still waits.
        with self.checkpoint.exclusive():
            ensure_wanted()
            held = self._held_by_others(claim)
            for _, params, _ in checked:
                _refuse_held(claim, params, held, self.config.node_name)
            devices: list[CdiDevice] = []
            prepared: list[PreparedDevice] = []
            for result, params, domain in checked:
                if result["device"] == cd.CHANNEL_DEVICE:
                    edits = self._channel_edits(claim, params, domain, fabric)
                else:
                    edits = self._daemon_edits(params, fabric)
                name = f"{claim.uid}-{result['device']}"
                devices.append(CdiDevice(name=name, edits=edits))
                prepared.append(
                    PreparedDevice(
                        pool_name=result["pool"],
                        device_name=result["device"],
                        cdi_device_ids=(self.cdi.device_id(name),),
                        request_names=(str(result["request"]).split("/")[0],),
                        share_id=result.get("shareID"),
                    )
                )
            path = self.cdi.path_for(claim.uid)
            # The checkpoint first, as in the devices driver: a spec on disk is always one
            # unprepare knows to remove, even after a crash between the two writes.
            self.checkpoint.put(
                ClaimEntry(
                    claim.uid,
                    claim.namespace,
                    claim.name,
                    (str(path),),
                    devices=tuple(
                        PreparedRecord(
                            device_name=p.device_name,
                            base_name=p.device_name,
                            cdi_device_ids=p.cdi_device_ids,
                            request_names=p.request_names,
                            share_id=p.share_id,
                        )
                        for p in prepared
                    ),
                )
            )
            self.cdi.write(claim.uid, CdiSpec(kind=CDI_KIND, devices=tuple(devices)))
            return prepared

    def _held_by_others(self, claim: ClaimRef) -> list[Held]:
        """What the other claims prepared on this node hold, read from the CDI specs the
        checkpoint says they wrote (what their containers were given): the node's own record,
        which holds whatever the API shows (a claim's label stripped, or the claim
        force-deleted while its pod runs). Called under the checkpoint's lock."""
        out = []
        for entry in self.checkpoint.entries():
            if entry.uid == claim.uid:
                continue  # a repeated prepare of the same claim
            for path in entry.cdi_specs:
                try:
                    spec = json.loads(Path(path).read_text())
                except FileNotFoundError:
                    continue  # never written (a crash after the checkpoint): given to nobody
                except (OSError, ValueError) as e:
                    # Unknown is not "nothing": the node is not taken for free.
                    raise PrepareError(
                        f"claim {claim}: cannot tell what claim {entry.namespace}/{entry.name} "
                        f"(uid {entry.uid}) holds on node {self.config.node_name}: {path}: {e}"
                    ) from None
                for device in spec.get("devices") or []:
                    out.append(_held(entry, device.get("containerEdits") or {}))
        return out

    def _imex_state(self, claim: ClaimRef, obj: JSON, fabric: str) -> tuple[bool, str]:
        """Is IMEX on this node ready for the claim's workload channels? (True for claims
        that need none: daemon claims, or managed mode where neither the domain's row for
        this node nor `fabric`, the node's label read once by prepare, names a fabric domain:
        nothing is imported.) Reads the domain afresh each time it is asked."""
        for result in self._results(obj):
            if result["device"] != cd.CHANNEL_DEVICE:
                continue
            params = self._params(obj, result)
            if params.get("imexMode") == "host":
                ready, message = self.host_imex(timeout=api_timeout())
                if not ready:
                    return ready, message
                continue
            domain = self._domain(claim, params)
            rows = domain.get("status", {}).get("nodes", []) or []
            row = next((r for r in rows if r.get("name") == self.config.node_name), None)
            # The domain's row decides, not the node's fabric label alone: discovery may drop
            # the label (a GPU lost its fabric registration) while the node stays in the
            # clique its row names, whose IMEX must still be READY. Nothing is imported
            # through IMEX only where neither the row nor the label names a fabric domain.
            if not (row or {}).get("fabricDomain") and not fabric:
                continue
            if row is None:
                return False, (
                    f"IMEX of ComputeDomain {params.get('domainName')} is not ready on node "
                    f"{self.config.node_name}: the node is not in the domain's status yet"
                )
            if not row.get("ready"):
                return False, (
                    f"IMEX of ComputeDomain {params.get('domainName')} is not ready on node "
                    f"{self.config.node_name}: {row.get('message') or 'no report yet'}"
                )
        return True, ""

    def fabric_domain(self) -> str:
        """This node's NVLink fabric domain ("" = none). Followed for the plugin's life: read
        from the Node at each use, since the devices agent labels a fresh node only after its
        first pass, and a plugin that kept the value it saw at start would skip the IMEX
        READY gate for good."""
        if not self.config.fabric_from_node:
            return self.config.fabric_domain
        try:
            node = self.rest.get(NODES, self.config.node_name, timeout=api_timeout())
        except ApiError as e:
            raise PrepareError(f"cannot read node {self.config.node_name}: {e}") from None
        return str((node["metadata"].get("labels") or {}).get(labels.FABRIC_DOMAIN, ""))

    def _results(self, obj: JSON) -> list[JSON]:
        allocation = (obj.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        return [
            r
            for r in results
            if r.get("driver") == cd.DRIVER and r.get("pool") == self.config.node_name
        ]

    def _params(self, obj: JSON, result: JSON) -> JSON:
        base = str(result["request"]).split("/")[0]
        allocation = obj["status"]["allocation"]
        found: JSON | None = None
        for entry in allocation.get("devices", {}).get("config", []) or []:
            opaque = entry.get("opaque") or {}
            requests = entry.get("requests") or []
            if opaque.get("driver") == cd.DRIVER and (not requests or base in requests):
                found = opaque.get("parameters")
        want = cd.OPAQUE_KIND if result["device"] == cd.CHANNEL_DEVICE else cd.DAEMON_OPAQUE_KIND
        if not isinstance(found, dict) or found.get("kind") != want:
            raise PrepareError(
                f"claim {obj['metadata']['name']}: no {want} configuration for "
                f"request {base!r}; use the claim template the ComputeDomain "
                "controller created"
            )
        # The model the controller wrote it through: every field is checked (the daemon's
        # host folder is named after domainUID), and the fields the writer may leave out get
        # their defaults, so the code below reads a complete configuration.
        try:
            return parse_opaque(found, want).model_dump(mode="json")
        except OpaqueConfigError as e:
            raise PrepareError(f"claim {obj['metadata']['name']}: {e}") from None

    def _domain(self, claim: ClaimRef, params: JSON) -> JSON:
        ns, name, uid = params.get("namespace"), params.get("domainName"), params.get("domainUID")
        if params["kind"] == cd.OPAQUE_KIND and ns != claim.namespace:
            raise PrepareError(
                f"claim {claim} is in namespace {claim.namespace} but its "
                f"ComputeDomain {name} is in {ns}"
            )
        # The daemon device hands over the domain's IMEX folder (read-write), the IMEX
        # management device and the driver's binaries: only the controller's own daemon
        # claims get it, made in the driver's namespace, which tenants cannot write to. Not
        # even the domain's own namespace: its tenant may not run an IMEX daemon.
        daemon_ns = self.config.daemon_namespace
        if params["kind"] == cd.DAEMON_OPAQUE_KIND and claim.namespace != daemon_ns:
            raise PrepareError(
                f"claim {claim} asks for the IMEX daemon of ComputeDomain {ns}/{name} from "
                f"namespace {claim.namespace}: daemon claims are prepared only in the "
                f"driver's namespace {daemon_ns}, where the ComputeDomain controller makes them"
            )
        try:
            domain = self.rest.get(COMPUTE_DOMAINS, str(name), str(ns), timeout=api_timeout())
        except ApiError as e:
            raise PrepareError(f"ComputeDomain {ns}/{name} of claim {claim}: {e}") from None
        if domain["metadata"].get("uid") != uid or domain["metadata"].get("deletionTimestamp"):
            raise PrepareError(
                f"ComputeDomain {ns}/{name} of claim {claim} is not the one the "
                "claim was made for (deleted or recreated)"
            )
        return domain

    def _channel_edits(
        self, claim: ClaimRef, params: JSON, domain: JSON, fabric: str
    ) -> ContainerEdits:
        channel = int(params.get("channel", -1))
        held = domain.get("status", {}).get("channels") or []
        if channel not in held:
            raise PrepareError(
                f"claim {claim} names IMEX channel {channel} but its ComputeDomain holds {held}"
            )
        # "All" in host mode is refused by the CRD; never trusted here.
        if params.get("imexMode") == "host" and params.get("allocationMode") == "All":
            raise PrepareError(
                f"claim {claim} asks for all IMEX channels of a host-mode domain: the "
                "host's channels are shared by every domain on it"
            )
        env = (
            f"FABRICDRA_COMPUTE_DOMAIN={params['domainName']}",
            f"FABRICDRA_COMPUTE_DOMAIN_UID={params['domainUID']}",
            f"FABRICDRA_IMEX_CHANNEL={channel}",
        )
        try:
            major = imex_major(self.config.proc_root)
        except ChannelError as e:
            raise PrepareError(str(e)) from None
        if major is None:
            if fabric:
                raise PrepareError(
                    f"node {self.config.node_name} is in NVLink fabric domain "
                    f"{fabric} but "
                    f"{self.config.proc_root / 'devices'} lists no "
                    "nvidia-caps-imex-channels: is the NVIDIA driver loaded?"
                )
            return ContainerEdits(env=env)  # no multi-node fabric: nothing to import/export
        if params.get("allocationMode") == "All":
            nodes = [ChannelNode(c, major) for c in range(cd.CHANNEL_COUNT)]
        else:
            nodes = [ChannelNode(channel, major)]
            try:
                ensure_host_node(self.config.dev_root, nodes[0])
            except ChannelError as e:
                raise PrepareError(str(e)) from None
        return ContainerEdits(
            env=env,
            device_nodes=tuple(
                DeviceNode(
                    path=n.container_path,
                    type="c",
                    major=n.major,
                    minor=n.channel,
                    permissions="rw",
                )
                for n in nodes
            ),
        )

    def _daemon_edits(self, params: JSON, fabric: str) -> ContainerEdits:
        folder = self.config.plugin_dir / "domains" / str(params["domainUID"])
        folder.mkdir(parents=True, exist_ok=True)
        env: tuple[str, ...] = (
            f"FABRICDRA_DOMAIN_UID={params['domainUID']}",
            f"FABRICDRA_DOMAIN_NAME={params['domainName']}",
            f"FABRICDRA_DOMAIN_NAMESPACE={params['namespace']}",
            f"FABRICDRA_FABRIC_DOMAIN={fabric}",
        )
        cfg = self.config
        view = cfg.driver_root_view or cfg.driver_root
        imex = imex_injection(cfg.driver_root, view, cfg.proc_root, cfg.dev_root)
        if imex.missing:
            log.warning("IMEX daemon prepared without: %s", "; ".join(imex.missing))
        # What the daemon checks and passes on to IMEX (imex.py): the loaded driver's version
        # (the SIGUSR1-reload guard) and where its libraries are mounted.
        if imex.driver_version:
            env = (*env, f"FABRICDRA_DRIVER_VERSION={imex.driver_version}")
        if imex.library_dir:
            env = (*env, f"FABRICDRA_IMEX_LIBRARY_PATH={imex.library_dir}")
        return ContainerEdits(
            env=env,
            mounts=(Mount(str(folder), "/imexd", ("rw", "nosuid", "nodev", "bind")), *imex.mounts),
            device_nodes=imex.device_nodes,
        )

    def host_imex(self, timeout: float = 10.0) -> tuple[bool, str]:
        """Whether this host's IMEX service answers READY (host mode), and what it said
        within `timeout` seconds (hostimex.py: the driver root's tool, over the service's
        command socket)."""
        cfg = self.config
        return HostImexCheck(
            ctl=cfg.imex_ctl,
            driver_root_view=cfg.driver_root_view or cfg.driver_root,
            socket=cfg.host_imex_socket,
            args=cfg.imex_ctl_args,
        ).query(timeout)

    # -- unprepare -----------------------------------------------------------------------
    def unprepare(self, claim: ClaimRef) -> None:
        with self.checkpoint.exclusive():
            entry = self.checkpoint.get(claim.uid)
            if entry is not None:
                remove_recorded_specs(entry, self.cdi)
            self.cdi.remove(claim.uid)  # also one written before its checkpoint entry existed
            if entry is not None:
                self.checkpoint.remove(claim.uid)
