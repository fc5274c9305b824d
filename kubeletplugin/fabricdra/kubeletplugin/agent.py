"""The devices.fabricdra.io node agent: discovery passes, publishing, and kubelet's gRPC.

    agent = Agent(AgentConfig(node_name="gpu-7"), api_client)
    agent.run(stop_event)       # returns when stop_event is set (SIGTERM/SIGINT in the CLI)

Each pass (every `discovery_interval` seconds, and at once when kubelet confirms a
registration — kubelet deletes the node's slices when it starts):
1. discovery over sysfs (+ NVML), `metrics.DISCOVERY_SECONDS`;
2. GPU health (`health.gpu_health`, NVML or the DCGM exporter; Xid critical errors drained
   from the NVML event set the agent holds open for its life, `xids.XidWatch`; between
   passes the set is drained every `XID_POLL_SECONDS`, and a new critical Xid starts a pass
   at once);
3. `build_devices` → the new `DeviceInventory`, swapped in as one reference, so prepare
   always resolves names against one complete pass;
4. `NodePublisher.sync` (slices, NodeDevices, labels; it compares with the live objects, so
   a pass that changes nothing writes nothing, and slices kubelet deleted come back);
5. the health stream snapshot (Unhealthy/healed devices reach kubelet at once).
Verification (docs/verification.md) runs inside a pass, before publishing, whenever it is due
(`verification.runner.Schedule`): the first pass runs it, so a new node is never offered on
trust; the publisher applies the gate from the last run.
The first pass runs before the sockets open, so kubelet never reaches a plugin without an
inventory. After each registration, passes also run `REGISTRATION_RECHECKS` seconds later:
kubelet wipes the node's slices in the background when it starts, and that wipe can land
after the pass the registration triggered; the recheck brings the slices back within seconds
instead of one discovery period.

Claim hygiene: at start-up the checkpoint drops entries of another boot (their spec files are
removed); every `sweep_interval` seconds claims checkpointed here that no longer exist in the
API are unprepared (`DevicesDriver.sweep`). Discovery or API failures are logged and the
previous state kept; the loop goes on.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog
from prometheus_client import start_http_server

from . import metrics
from .devices import (
    DeviceConfig,
    DeviceInventory,
    GpuHealth,
    build_devices,
    gpu_info,
    holder_name,
)
from .discovery.node import Discovery, NvmlSource, Previous, discover
from .discovery.nvml import (
    LiveXidEvents,
    ReplayedXidEvents,
    XidEventSource,
    load_snapshot,
    read_live,
)
from .discovery.sysfs import SysfsTree
from .health import DcgmState, gpu_health, keep_unhealthy, nvidia_bound
from .hostdevices import HostLayout
from .kubelet import DeviceHealth, HealthBroadcaster, PluginPaths, PluginServer
from .kubelet.cdi import CdiWriter
from .kubelet.checkpoint import BOOT_ID_PATH, Checkpoint, current_boot_id
from .nvidiacdi import DEFAULT_SPEC_DIRS, ToolkitSpecs
from .prepare import CDI_KIND, DRIVER_NAME, ApiClaimReader, ClaimReader, DevicesDriver
from .verification import GateInput, Tools, fingerprint
from .verification import metrics as verification_metrics
from .verification.runner import CHANGED, FIRST_RUN, Schedule, run_once
from .xids import XidWatch

log = structlog.get_logger("fabricdra.agent")

REGISTRATION_RECHECKS = (2.0, 5.0, 15.0)  # seconds after a registration: extra passes
XID_POLL_SECONDS = 2.0  # between passes, how often the Xid event set is drained


class Publisher(Protocol):
    def sync(
        self, discovery: Discovery, devices: DeviceInventory, verification: GateInput | None = ...
    ) -> Any: ...


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    sysfs_root: Path = Path("/sys")
    nvml_snapshot: Path | None = None  # recorded NVML answers instead of the library
    cdi_dir: Path = Path("/var/run/cdi")
    toolkit_cdi_dirs: tuple[Path, ...] = DEFAULT_SPEC_DIRS
    plugin_dir: Path = Path("/var/lib/kubelet/plugins") / DRIVER_NAME
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    pod_uid: str | None = None  # per-pod socket names (rolling updates), see PluginPaths
    state_dir: Path | None = None  # checkpoint folder; default: plugin_dir
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    discovery_interval: float = 30.0
    dcgm_url: str | None = None
    metrics_port: int | None = None  # None or 0: no metrics HTTP server
    metrics_address: str = "0.0.0.0"
    health_resend_seconds: float = 10.0
    sweep_interval: float = 600.0  # seconds between sweeps of claims gone from the API
    # "auto": from the API server's version; "current"/"basic" override it (docs/attributes.md).
    resource_model: Literal["auto", "current", "basic"] = "auto"
    # The verification gate (docs/verification.md): off only where discovery is trusted.
    verification_gate: bool = True
    verify_interval: float = 24 * 3600.0  # seconds between runs on an unchanged node
    verify_tools: Tools = field(default_factory=Tools)
    boot_id_file: Path = BOOT_ID_PATH  # the kernel's boot id: state of another boot is dropped

    @property
    def checkpoint_path(self) -> Path:
        return (self.state_dir or self.plugin_dir) / "checkpoint.json"

    @property
    def xid_record_path(self) -> Path:
        """The critical Xids seen in this boot (they are events: NVML never repeats them)."""
        return (self.state_dir or self.plugin_dir) / "xid-errors.json"


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        api: Any,
        *,
        publisher: Publisher | None = None,
        claims: ClaimReader | None = None,
    ) -> None:
        self.config = config
        SysfsTree(config.sysfs_root).close()  # a bad root fails at start, not at the first pass
        self.nvml_source: NvmlSource = read_live
        xid_source: XidEventSource = LiveXidEvents()
        if config.nvml_snapshot is not None:
            snapshot = config.nvml_snapshot
            self.nvml_source = lambda: load_snapshot(snapshot)
            xid_source = ReplayedXidEvents(snapshot)
        boot_id = current_boot_id(config.boot_id_file)
        self.xids = XidWatch(xid_source, state_file=config.xid_record_path, boot_id=boot_id)
        if publisher is None:
            from .publisher import NodePublisher
            from .resourceslices import ApiFeatures

            features = (
                None if config.resource_model == "auto" else ApiFeatures(config.resource_model)
            )
            publisher = NodePublisher(api, config.node_name, features=features)
        self.publisher = publisher
        self.health = HealthBroadcaster(resend_seconds=config.health_resend_seconds)
        self.dcgm_state = DcgmState()
        self._gpu_health: dict[str, GpuHealth] = {}
        self.inventory = DeviceInventory(())
        self.previous: Previous | None = None
        self.verification = Schedule(interval=config.verify_interval)
        self._restored = False
        self._fingerprint = ""
        self.wake = threading.Event()
        self._rechecks: list[float] = []  # monotonic times of extra passes still due
        self.passes = 0  # discovery passes done
        reader = ApiClaimReader(api)
        checkpoint = Checkpoint(config.checkpoint_path, boot_id=boot_id)
        self.driver = DevicesDriver(
            node_name=config.node_name,
            inventory=lambda: self.inventory,
            claims=claims or reader,
            cdi=CdiWriter(config.cdi_dir, CDI_KIND),
            checkpoint=checkpoint,
            host=HostLayout(config.dev_root, config.proc_root, config.sysfs_root),
            toolkit=ToolkitSpecs(config.toolkit_cdi_dirs),
            events=reader,
        )
        self.server = PluginServer(
            self.driver,
            PluginPaths.for_driver(
                DRIVER_NAME,
                registry_dir=config.registry_dir,
                plugin_dir=config.plugin_dir,
                instance=config.pod_uid,
            ),
            health=self.health,
            on_registration=self._registered,
            metrics=metrics.claim_metrics(),
        )

    def _registered(self, status: Any) -> None:
        if status.registered:
            now = time.monotonic()
            self._rechecks = [now + d for d in REGISTRATION_RECHECKS]
            self.wake.set()

    def pass_once(self) -> DeviceInventory:
        """One discovery + publish pass; returns the inventory it swapped in."""
        start = time.perf_counter()
        # A fresh tree per pass: its resolution cache is only valid while the node holds
        # still, and devices come and go (hot plug, VFs reconfigured, renamed netdevs).
        tree = SysfsTree(self.config.sysfs_root)
        try:
            discovery = discover(tree, self.nvml_source, self.previous)
            inventory = self._take(discovery, start)
            if not self.config.verification_gate:
                self._publish(discovery, inventory, None)
                return inventory
            why = self._verification_due(tree, discovery)
            if why in (FIRST_RUN, CHANGED):
                # Published unverified while the run goes on (bandwidth tools take minutes):
                # an old result never speaks for new hardware, a new node is never offered.
                self._publish(discovery, inventory, self._gate())
            if why is not None:
                self._run_verification(tree, discovery, why)
            self._publish(discovery, inventory, self._gate())
        finally:
            tree.close()
        return inventory

    def _take(self, discovery: Discovery, start: float) -> DeviceInventory:
        """Swap in this pass's inventory and tell kubelet about device health."""
        for part, reason in discovery.failures.items():
            log.error("discovery failed; keeping the previous record", part=part, error=reason)
        gpus = keep_unhealthy(
            gpu_health(
                self.xids.apply(discovery.nvml),
                self.config.dcgm_url,
                state=self.dcgm_state,
                expected=nvidia_bound(discovery.accelerators),
            ),
            self._gpu_health,
        )
        self._gpu_health = gpus
        inventory = build_devices(
            discovery.interfaces or [],
            discovery.accelerators or [],
            self.config.devices,
            gpus,
            gpu_info(discovery.nvml),
        )
        self.inventory = inventory
        metrics.DISCOVERY_SECONDS.observe(time.perf_counter() - start)
        self.passes += 1
        self.previous = Previous(discovery.interfaces, discovery.accelerators)
        self.health.publish(health_reports(self.config.node_name, inventory))
        _count_devices(inventory)
        return inventory

    def _publish(
        self, discovery: Discovery, inventory: DeviceInventory, gate: GateInput | None
    ) -> None:
        try:
            result = self.publisher.sync(discovery, inventory, gate)
        except Exception as e:  # the API may be down: keep serving, try again next pass
            log.error("publishing failed; retrying next pass", error=str(e))
        else:
            writes = getattr(result, "writes", None)
            if writes:
                log.info("published", writes=writes)
        if gate is not None:
            verification_metrics.record_state(getattr(self.publisher, "verification", None))

    def _gate(self) -> GateInput:
        return GateInput(self.verification.last_run, self._fingerprint)

    def _verification_due(self, tree: SysfsTree, discovery: Discovery) -> str | None:
        if not self._restored and self.verification.last_run is None:
            recorded = getattr(self.publisher, "recorded_verification", None)
            try:
                if recorded is not None:
                    self.verification.restore(recorded())
                self._restored = True
            except Exception as e:  # the API may be down: this pass verifies afresh
                log.warning("recorded verification unreadable", error=str(e))
        if discovery.interfaces is None or discovery.accelerators is None:
            return None  # only a complete enumeration says what the node has: keep the last
        self._fingerprint = fingerprint(tree, discovery.interfaces, discovery.accelerators)
        return self.verification.due(self._fingerprint)

    def _run_verification(self, tree: SysfsTree, discovery: Discovery, why: str) -> None:
        log.info("verification run starting", reason=why)
        self.verification.ran(
            run_once(
                tree,
                discovery.interfaces or [],
                discovery.accelerators or [],
                discovery.nvml,
                self._fingerprint,
                tools=self.config.verify_tools,
            )
        )

    def request_verification(self) -> None:
        """Run verification in the next pass, and start that pass now."""
        self.verification.requested = True
        self.wake.set()

    def run(self, stop: threading.Event) -> None:
        servers: list[Any] = []
        ended = threading.Event()
        binder = None
        if self.config.metrics_port:
            binder = threading.Thread(
                target=self._serve_metrics, args=(ended, servers), name="metrics", daemon=True
            )
            binder.start()
        try:
            self._serve(stop)
        finally:
            ended.set()
            if binder is not None:
                binder.join()
            for http in servers:
                http.shutdown()
                http.server_close()

    def _serve_metrics(self, ended: threading.Event, servers: list[Any]) -> None:
        """Open the metrics port, retrying while it is taken: in the host network, a rolling
        update's new pod starts while the old pod still holds the port (maxSurge), and
        serves it once the old pod has exited."""
        port, warned = self.config.metrics_port or 0, False
        while not ended.is_set():
            try:
                http, _ = start_http_server(
                    port, self.config.metrics_address, registry=metrics.REGISTRY
                )
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    log.error("metrics port cannot be opened", port=port, error=str(e))
                    return
                if not warned:
                    log.warning("metrics port in use (another pod?); retrying", port=port)
                    warned = True
                ended.wait(1.0)
                continue
            servers.append(http)
            log.info("metrics served", port=port)
            return

    def seed_history(self) -> None:
        """Start from the link history this node last published (NodeDevices), so a failure's
        first-seen time — the taint's timeAdded — survives a plugin restart. Best effort: an
        unreadable record means starting afresh, as before."""
        recorded = getattr(self.publisher, "recorded_interfaces", None)
        if self.previous is not None or recorded is None:
            return
        try:
            interfaces = recorded()
        except Exception as e:
            log.warning(
                "cannot read the published NodeDevices; link history starts now", error=str(e)
            )
            return
        if interfaces is not None:
            self.previous = Previous(interfaces, None)

    def _serve(self, stop: threading.Event) -> None:
        self.seed_history()
        self.pass_once()
        self.server.start()
        next_sweep = time.monotonic() + self.config.sweep_interval
        next_pass = time.monotonic() + self.config.discovery_interval
        try:
            while not stop.is_set():
                woken = self.wake.wait(min(self._until_next_pass(next_pass), XID_POLL_SECONDS))
                self.wake.clear()
                if stop.is_set():
                    break
                now = time.monotonic()
                due = woken or now >= next_pass or any(t <= now for t in self._rechecks)
                if not due:
                    # Xid events between passes: a new critical one is published now.
                    try:
                        fresh = self.xids.poll()
                    except Exception:
                        log.exception("Xid poll failed; the next pass reads them")
                        fresh = False
                    if not fresh:
                        continue
                    log.info("critical Xid error seen; publishing now")
                self._rechecks = [t for t in self._rechecks if t > now]
                try:
                    self.pass_once()
                except Exception:
                    log.exception("discovery pass failed")
                next_pass = time.monotonic() + self.config.discovery_interval
                if now >= next_sweep:
                    next_sweep = now + self.config.sweep_interval
                    try:
                        self.driver.sweep()
                    except Exception:
                        log.exception("claim sweep failed")
        finally:
            self.server.stop()
            self.xids.close()

    def _until_next_pass(self, next_pass: float) -> float:
        wait = max(0.0, next_pass - time.monotonic())
        if self._rechecks:
            wait = min(wait, max(0.0, min(self._rechecks) - time.monotonic()))
        return wait

    def stop_event_wakes(self, stop: threading.Event) -> None:
        """Make `stop` also end the wait between passes (call from the signal handler)."""
        stop.set()
        self.wake.set()


def health_reports(pool: str, inventory: DeviceInventory) -> list[DeviceHealth]:
    """One entry per published device name (including a shared endpoint's holder names,
    published as separate devices on 1.34/1.35 clusters), so kubelet hears about every
    device it may have prepared."""
    out = []
    for d in inventory:
        out.append(DeviceHealth(pool, d.name, d.health, d.health_reason))
        if d.mode == "shared":
            out.extend(
                DeviceHealth(pool, holder_name(d.name, k), d.health, d.health_reason)
                for k in range(inventory.shared_holders)
            )
    return out


def _count_devices(inventory: DeviceInventory) -> None:
    counts: dict[tuple[str, str], int] = {}
    for d in inventory:
        counts[(d.type, d.health)] = counts.get((d.type, d.health), 0) + 1
    for type_ in ("gpu", "mig", "rdma"):
        for health in ("Healthy", "Unhealthy", "Unknown"):
            metrics.DEVICES.labels(type_, health).set(counts.get((type_, health), 0))
