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
3. `assembly.assemble` → the new `DeviceInventory`, swapped in as one reference, so prepare
   always resolves names against one complete pass, and its health sent to kubelet's health
   stream at once (Unhealthy/healed devices reach kubelet before any API read of the pass).
   A GPU seen earlier that a complete enumeration no longer finds (the kernel removed it: fell
   off the bus) is kept from its last record, Unhealthy and marked lost (prepare refuses it):
   until this process ends, and across a restart while a prepared claim holds it
   (seengpus.py). The node's RDMA mode (the Node's `fabricdra.io/rdma-mode` label; absent:
   `--rdma-mode`; invalid: an error log, a Warning event on the NodeDevices record, and
   `--rdma-mode`; unreadable: the last mode read), the reverify annotation, the device plugins
   on the Node's capacity and which holds' claims are gone from the API are the last values
   read by apifacts.py (one read of the Node gives the first three), on its own thread once
   the agent runs (a read that changed one starts a pass); RDMA endpoints prepared claims
   hold (the checkpoint) keep the mode they are held in until unprepared; one whose claim is
   gone from the API is withheld until unprepared (only the claims whose hold changes what is
   offered are read, `pins_mode`). Devices another advertiser hands out on this node are
   withheld (coexistence.py: a device plugin's resource in the Node's capacity, as last read:
   unreadable, the last answer; never read, every group it decides; for RDMA and EFA, the
   RDMA subsystem in exclusive namespace mode, read from sysfs each pass), with a log line and
   a `DevicesWithheld` Warning event on the Node when that set changes, both once the pass
   has published (the event never comes before health or the slices);
4. `NodePublisher.sync` (slices, NodeDevices, labels; it compares with the live objects, so
   a pass that changes nothing writes nothing, and slices kubelet deleted come back).
Verification (docs/verification.md) runs whenever it is due, the publisher applying the gate
from the last run (verificationgate.py).
The first pass runs before the sockets open, so kubelet never reaches a plugin without an
inventory. After each registration, passes also run `REGISTRATION_RECHECKS` seconds later:
kubelet wipes the node's slices in the background when it starts, and that wipe can land
after the pass the registration triggered; the recheck brings the slices back within seconds
instead of one discovery period.

Claim hygiene: at start-up the checkpoint drops entries of another boot (their spec files are
removed, only inside the CDI folder); every `sweep_interval` seconds, on its own thread (a
hung claim read never holds up a pass), claims checkpointed here that no longer exist in the
API are reported (`kubelet.ClaimSweeper`) — never freed: only kubelet's unprepare frees a
device (docs/kubelet-plugin.md, "The sweep"). Discovery or API failures are logged and the
previous state kept; the loop goes on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog

from fabricdra.api.verification import SystemProfile

from . import metrics
from .apifacts import ApiFacts, Facts
from .assembly import assemble
from .coexistence import (
    BUILTIN_RULES,
    Rule,
)
from .devices import (
    DeviceConfig,
    DeviceInventory,
    GpuHealth,
    HeldAs,
    holder_name,
)
from .discovery.node import Discovery, Previous, discover
from .discovery.scaleout.annotate import ScaleOutInputs
from .discovery.sysfs import SysfsTree
from .families import DEFAULT_TOOLKIT_DIRS
from .families import build as build_families
from .health import DcgmState, gpu_health, keep_unhealthy, nvidia_bound
from .hostdevices import HostLayout
from .kinds import held_devices, held_endpoints, pins_mode  # the RDMA family's (kinds/rdma/)
from .kinds.family import PassFacts
from .kubelet import ClaimSweeper, DeviceHealth, HealthBroadcaster, PluginPaths, PluginServer
from .kubelet.cdi import CdiWriter
from .kubelet.checkpoint import BOOT_ID_PATH, Checkpoint, ClaimEntry, current_boot_id
from .kubelet.claims import ClaimReader
from .networkstatus import NetworkStatus
from .prepare import CDI_KIND, DRIVER_NAME, ApiClaimReader, DevicesDriver
from .scaleoutsources import NeighbourSources, ScaleOutConfig, inputs_for
from .verification import GateInput, Tools
from .verification import metrics as verification_metrics
from .verification.runner import Schedule
from .verificationgate import VerificationGate
from .withholding import Withholding

if TYPE_CHECKING:
    from .discovery.nvml import NvmlReadings

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
    toolkit_cdi_dirs: tuple[Path, ...] = DEFAULT_TOOLKIT_DIRS
    plugin_dir: Path = Path("/var/lib/kubelet/plugins") / DRIVER_NAME
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    pod_uid: str | None = None  # per-pod socket names (rolling updates), see PluginPaths
    state_dir: Path | None = None  # checkpoint folder; default: plugin_dir
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    # KEP-5304: each request's device metadata file mounted into the containers (under
    # plugin_dir, which the chart mounts at the same path on the host).
    device_metadata: bool = False
    # NCCL_TOPO_FILE for every claim with a GPU (kinds/rdma/nccltopofiles.py), under plugin_dir too.
    nccl_topo_file: bool = True
    # DRAListTypeAttributes is on in the cluster (alpha in 1.36): list values (a Grace GPU's
    # NUMA nodes) may be published.
    list_type_attributes: bool = False
    # Fatal faults (a GPU lost, uncorrectable memory errors, a reset NVML asks for) taint
    # NoExecute, so the device taint eviction controller evicts the pods using the device.
    evict_on_fatal: bool = False
    discovery_interval: float = 30.0
    dcgm_url: str | None = None
    metrics_port: int | None = None  # None or 0: no metrics HTTP server
    metrics_address: str = "0.0.0.0"
    health_resend_seconds: float = 10.0
    sweep_interval: float = 600.0  # seconds between reports of claims gone from the API
    # "auto": from the API server's version; "current"/"basic" override it (docs/attributes.md).
    resource_model: Literal["auto", "current", "basic"] = "auto"
    # The verification gate (docs/verification.md): off only where discovery is trusted.
    verification_gate: bool = True
    verify_interval: float = 24 * 3600.0  # seconds between runs on an unchanged node
    verify_tools: Tools = field(default_factory=Tools)
    # The active probes run in a pod from this image on this node (None: here, with
    # verify_tools.path), in verify_namespace (docs/verification.md, "The verification pod").
    verify_image: str | None = None
    verify_namespace: str = "fabricdra-system"
    verify_runtime_class: str | None = None
    # The system profile the node is held to (None: the built-in one its DMI model names).
    verify_expect: SystemProfile | None = None
    boot_id_file: Path = BOOT_ID_PATH  # the kernel's boot id: state of another boot is dropped
    # Device plugin resources whose advertisement on the Node withholds a group of devices
    # (coexistence.py; the built-in table plus `--device-plugin-resource`).
    device_plugin_rules: tuple[Rule, ...] = BUILTIN_RULES
    # Scale-out discovery (docs/scale-out.md): neighbour sources, topology file, role selectors.
    scale_out: ScaleOutConfig = field(default_factory=ScaleOutConfig)

    @property
    def checkpoint_path(self) -> Path:
        return (self.state_dir or self.plugin_dir) / "checkpoint.json"

    @property
    def mig_journal_path(self) -> Path:
        """The MIG instances dynamic MIG created (kinds/nvidia/dynamicmig.py)."""
        return (self.state_dir or self.plugin_dir) / "dynamic-mig.json"


def _node_publisher(config: AgentConfig, api: Any) -> Publisher:
    """The publisher of this node's ResourceSlices and NodeDevices record."""
    from .publisher import NodePublisher
    from .resourceslices import ApiFeatures

    lists = config.list_type_attributes
    features = (
        None
        if config.resource_model == "auto"
        else ApiFeatures(config.resource_model, list_attributes=lists)
    )
    return NodePublisher(
        api,
        config.node_name,
        features=features,
        list_attributes=lists,
        evict_on_fatal=config.evict_on_fatal,
    )


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        api: Any,
        *,
        publisher: Publisher | None = None,
        claims: ClaimReader | None = None,
        mig_nvml: Any = None,  # dynamic MIG's NVML calls (tests' fakes); None: the library's
    ) -> None:
        self.config = config
        SysfsTree(config.sysfs_root).close()  # a bad root fails at start, not at the first pass
        boot_id = current_boot_id(config.boot_id_file)
        # Each device family's state (families.py), driven through its hooks (kinds/family.py).
        self.families = build_families(
            config.devices,
            state_dir=config.state_dir or config.plugin_dir,
            boot_id=boot_id,
            toolkit_cdi_dirs=config.toolkit_cdi_dirs,
            nvml_snapshot=config.nvml_snapshot,
            mig_nvml=mig_nvml,
        )
        self.publisher = publisher or _node_publisher(config, api)
        self.neighbours = NeighbourSources(config.scale_out)
        self._topology_problem: str | None = None
        self.health = HealthBroadcaster(resend_seconds=config.health_resend_seconds)
        self.dcgm_state = DcgmState()
        self._gpu_health: dict[str, GpuHealth] = {}
        self.inventory = DeviceInventory(())
        self.previous: Previous | None = None
        self.wake = threading.Event()
        self._rechecks: list[float] = []  # monotonic times of extra passes still due
        self.passes = 0  # discovery passes done
        reader = ApiClaimReader(api)
        checkpoint = Checkpoint(config.checkpoint_path, boot_id=boot_id)
        self.driver = self._devices_driver(api, claims, reader, checkpoint)
        # The API reads a pass uses (the Node: RDMA mode label, reverify annotation, device
        # plugins on its capacity; gone holds): their own thread once the agent runs, so a hung
        # API server never holds up health or taints.
        self.facts = ApiFacts(
            metrics.counting_rest(api),
            config.node_name,
            config.devices.rdma_mode,
            self.driver.claims,
            self.wake.set,
            rules=config.device_plugin_rules,
            offline=api is None,  # without an API (offline, unit tests) no Node to read
        )
        self.withholding = Withholding(self.facts)
        self.gate = VerificationGate(
            config, api, self.publisher, self.facts, checkpoint, self.wake.set
        )
        # Its own thread: a hung claim read never holds up discovery, Xid or health updates.
        self.sweeper = ClaimSweeper(
            checkpoint, self.driver.claims, config.sweep_interval, DRIVER_NAME
        )
        self.server = self._plugin_server()

    def _plugin_server(self) -> PluginServer:
        """kubelet's registration and DRA gRPC sockets, serving the driver and health."""
        config = self.config
        return PluginServer(
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

    def _devices_driver(
        self,
        api: Any,
        claims: ClaimReader | None,
        reader: ApiClaimReader,
        checkpoint: Checkpoint,
    ) -> DevicesDriver:
        """Prepare and unprepare (kubelet's gRPC calls): claims read through `claims`, else
        from the API server by `reader`."""
        config = self.config
        return DevicesDriver(
            node_name=config.node_name,
            inventory=lambda: self.inventory,
            claims=claims or reader,
            cdi=CdiWriter(config.cdi_dir, CDI_KIND),
            checkpoint=checkpoint,
            host=HostLayout(config.dev_root, config.proc_root, config.sysfs_root),
            devices=config.devices,
            events=reader,
            # PodGroup links (KEP-5729) are read where the claims are: from the API server.
            pods=reader if claims is None else None,
            metadata_dir=config.plugin_dir / "metadata" if config.device_metadata else None,
            nccl_topo_dir=config.plugin_dir / "nccl-topo" if config.nccl_topo_file else None,
            # Only where claims are read from the API server is there one to write to.
            network=None
            if claims is not None
            else NetworkStatus(
                metrics.counting_rest(api), config.node_name, config.sysfs_root, config.proc_root
            ),
            **self.families.driver_options(),
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
            discovery = discover(
                tree, self.families.nvml_source, self.previous, scaleout=self._scale_out_inputs()
            )
            inventory = self._take(discovery, start, tree)
            if not self.config.verification_gate:
                self._publish(discovery, inventory, None)
                self.withholding.report()
                return inventory
            self.gate.run_in_pass(tree, discovery, lambda g: self._publish(discovery, inventory, g))
            self.withholding.report()
        finally:
            tree.close()
        return inventory

    def _scale_out_inputs(self) -> ScaleOutInputs:
        self.neighbours.begin_pass()
        inputs, problem = inputs_for(self.config.node_name, self.config.scale_out, self.neighbours)
        if problem != self._topology_problem:  # logged once per change, not every pass
            if problem is not None:
                log.error("topology file not used; no declared scale-out facts", error=problem)
            self._topology_problem = problem
        return inputs

    def _pass_gpu_health(
        self, discovery: Discovery, nvml: NvmlReadings | None
    ) -> dict[str, GpuHealth]:
        """This pass's GPU health (NVML, DCGM, AMD), a GPU once unhealthy kept so."""
        self._gpu_health = keep_unhealthy(
            gpu_health(
                nvml,
                self.config.dcgm_url,
                state=self.dcgm_state,
                expected=nvidia_bound(discovery.accelerators),
                amd=discovery.amd,
            ),
            self._gpu_health,
        )
        return self._gpu_health

    def _take(self, discovery: Discovery, start: float, tree: SysfsTree) -> DeviceInventory:
        """Swap in this pass's inventory and tell kubelet about device health."""
        for part, reason in discovery.failures.items():
            log.error("discovery failed; keeping the previous record", part=part, error=reason)
        entries = self.driver.checkpoint.entries()
        uids = [e.uid for e in entries]
        # What the families add to the pass (NVIDIA: Xids applied to the readings, GPUs that
        # left the bus, the MIG instances dynamic MIG created).
        pass_facts = PassFacts(nvml=discovery.nvml)
        for family in self.families.all:
            family.observe(discovery, held_devices(entries), pass_facts)
        nvml, lost, created_mig = pass_facts.nvml, pass_facts.lost, pass_facts.created_mig
        gpus = self._pass_gpu_health(discovery, nvml)
        netns = self.withholding.netns(tree)  # a local read (sysfs), once per pass

        def inventory_for(facts: Facts) -> tuple[DeviceInventory, list[ClaimEntry]]:
            """This pass's inventory under `facts`, and the claims whose hold changes what
            is offered (`pins_mode`) that are not known gone: the ones worth reading."""
            config = replace(self.config.devices, rdma_mode=facts.mode)

            def build(held: dict[str, HeldAs]) -> DeviceInventory:
                return assemble(
                    discovery,
                    config,
                    tree,
                    nvml=nvml,
                    gpu_health=gpus,
                    lost=lost,
                    held=held,
                    created_mig=created_mig,
                )

            natural = build({})
            pinning = [e for e in entries if e.uid not in facts.gone and pins_mode(e, natural)]
            held = held_endpoints(e for e in entries if e.uid not in facts.gone)
            inventory = build(held)
            # Held by a claim gone from the API (kubelet has not unprepared it): offered in
            # no mode until kubelet does, as prepare would refuse every new claim of it.
            gone = held_endpoints(e for e in entries if e.uid in facts.gone)
            withheld = set(gone) - set(held)
            if withheld:
                inventory = replace(
                    inventory, devices=tuple(d for d in inventory if d.name not in withheld)
                )
            return self.withholding.apply(inventory, facts, netns), pinning

        # Health first, from local facts and the last-known API facts: no API read comes
        # before kubelet hears about a device (issue 29 point 4).
        facts = self.facts.current(uids)
        inventory, pinning = inventory_for(facts)
        self._swap(inventory)
        age = facts.age()
        if self.facts.running and age is not None and age > 3 * self.config.discovery_interval:
            log.warning(
                "node not read for a while; its last RDMA mode and device plugins apply",
                age_s=int(age),
            )
        if not self.facts.request(pinning):
            # A lone pass (the first, before the sockets open; or a test's): the reads
            # happen here, after health, and the pass applies what they found.
            changed = self.facts.refresh_node()
            if changed:
                _, pinning = inventory_for(self.facts.current(uids))
            if self.facts.refresh_holds(pinning) or changed:
                inventory, _ = inventory_for(self.facts.current(uids))
                self._swap(inventory)
        metrics.DISCOVERY_SECONDS.observe(time.perf_counter() - start)
        self.passes += 1
        self.previous = Previous(discovery.interfaces, discovery.accelerators)
        return inventory

    @property
    def withheld(self) -> dict[str, list[str]]:
        """This pass's devices withheld, by group (coexistence.py)."""
        return self.withholding.withheld

    def _swap(self, inventory: DeviceInventory) -> None:
        """Make `inventory` the one prepare resolves against, and tell kubelet its health."""
        self.inventory = inventory
        self.health.publish(health_reports(self.config.node_name, inventory))
        _count_devices(inventory)

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

    @property
    def verification(self) -> Schedule:
        """When verification is due, and its last run (verificationgate.py)."""
        return self.gate.schedule

    def join_verification(self, timeout: float | None = None) -> bool:
        """Wait for a background run to end (tests, shutdown); True when none is under way."""
        return self.gate.join(timeout)

    def request_verification(self) -> None:
        """Run verification in the next pass (fresh error-counter window), and start that
        pass now."""
        self.gate.request()

    def run(self, stop: threading.Event) -> None:
        servers: list[Any] = []
        ended = threading.Event()
        binder = None
        if self.config.metrics_port:
            where = (self.config.metrics_port or 0, self.config.metrics_address, ended, servers)
            binder = threading.Thread(target=metrics.serve, args=where, name="metrics", daemon=True)
            binder.start()
        try:
            self._serve(stop)
        finally:
            self.neighbours.close()
            ended.set()
            if binder is not None:
                binder.join()
            for http in servers:
                http.shutdown()
                http.server_close()

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

    def start_families(self) -> None:
        """At start-up, before kubelet can prepare anything: each family's start hook (NVIDIA:
        dynamic MIG records a crash left half-made are resolved)."""
        for family in self.families.all:
            family.start()

    def _serve(self, stop: threading.Event) -> None:
        self.start_families()
        self.seed_history()
        self.pass_once()
        self.server.start()
        self.sweeper.start()
        self.facts.start()
        next_pass = time.monotonic() + self.config.discovery_interval
        try:
            while not stop.is_set():
                woken = self.wake.wait(min(self._until_next_pass(next_pass), XID_POLL_SECONDS))
                self.wake.clear()
                if stop.is_set():
                    break
                now = time.monotonic()
                due = woken or now >= next_pass or any(t <= now for t in self._rechecks)
                # Events between passes (a new critical Xid): published now.
                if not due and not self._families_poll():
                    continue
                self._rechecks = [t for t in self._rechecks if t > now]
                try:
                    self.pass_once()
                except Exception:
                    log.exception("discovery pass failed")
                next_pass = time.monotonic() + self.config.discovery_interval
        finally:
            self.facts.stop()
            self.sweeper.stop()
            self.server.stop()
            for family in self.families.all:
                family.close()

    def _families_poll(self) -> bool:
        fresh = False
        for family in self.families.all:
            try:
                if family.poll():
                    log.info("a device event asks for a pass; publishing now", family=family.name)
                    fresh = True
            except Exception:
                log.exception("device event poll failed; the next pass reads them")
        return fresh

    def _until_next_pass(self, next_pass: float) -> float:
        wait = max(0.0, next_pass - time.monotonic())
        if self._rechecks:
            wait = min(wait, max(0.0, min(self._rechecks) - time.monotonic()))
        return wait

    def stop_event_wakes(self, stop: threading.Event) -> None:
        """Make `stop` also end the wait between passes. Not from a signal handler itself: it
        may run inside the main thread's wait on `wake`, holding the lock set() needs."""
        stop.set()
        self.wake.set()


def health_reports(pool: str, inventory: DeviceInventory) -> list[DeviceHealth]:
    """One entry per published device name (including a shared endpoint's holder names,
    published as separate devices on 1.34/1.35 clusters), so kubelet hears about every
    device it may have prepared."""
    out = []
    for d in inventory:
        out.append(DeviceHealth(pool, d.name, d.health, d.health_reason))
        if d.name in inventory.holder_sets:
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
