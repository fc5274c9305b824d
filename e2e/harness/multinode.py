"""Several real nodes on this machine: one control plane, and per node its own containerd and
kubelet, each registered as a distinct Ready Node.

Used by the `multi_node_cluster` pytest fixture (e2e.harness.pytest_plugin). Each node has:

- its own address and name: node i is `127.0.0.<11+i>` (the whole 127/8 is loopback, so the
  apiserver reaches each kubelet at its node's Hostname address, and each node reports a
  distinct InternalIP: IMEX peers are told apart by it);
- its own kubelet root dir (under a short /tmp/fdra-mn-<random>/: plugin sockets go there,
  and a unix socket path holds 107 bytes), ports (kubelet, healthz), containerd
  root/state/socket, CDI spec dir, CNI bridge and pod subnet, pod log dir;
- its own cgroup root (`/fabricdra-e2e-node-<i>`): kubelets sharing `/kubepods` would each
  remove the others' pod cgroups as orphans.

What stays machine-wide (the kernel sysctls the kubelets set, their iptables chains, pod
processes in `*/kubepods` cgroups) is why this never runs beside the single-node cluster: it
takes the same lock, /run/fabricdra-e2e.lock. Teardown leaves nothing behind: pods, shims,
mounts, cgroups, bridges, iptables chains and the pod network's FORWARD rule; the sysctls
(net.ipv4.ip_forward among them: pods on different nodes talk through the host) are restored.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from e2e.harness import binaries, images
from e2e.harness.controlplane import ControlPlane, KubeControllerManager, KubeScheduler
from e2e.harness.errors import HarnessError
from e2e.harness.nodecluster import (
    _CONTAINERD_TOML,
    CGROUP_ROOT,
    DEFAULT_BASE,
    NODE_READY_TIMEOUT,
    _ctr,
    _kill_pod_processes,
    _kubelet_chains,
    _read_sysctls,
    _remove_container_log_links,
    _remove_kubelet_chains,
    _remove_kubepods_cgroups,
    _restore_sysctls,
    _run,
    _running_daemons,
    _unmount_under,
    kubelet_config,
    release_machine_lock,
    take_machine_lock,
    write_cni_config,
)
from e2e.harness.poll import wait_for
from e2e.harness.process import Daemon, free_port, kill_matching

FIRST_HOST = 11  # node i listens on 127.0.0.<FIRST_HOST + i>
POD_NETWORK = "10.245.0.0/16"  # every node's pod subnet 10.245.<i>.0/24
# Pods on different nodes talk through the host, which routes between the nodes' bridges:
# the harness turns forwarding on (restored at teardown) and lets the pod network through the
# FORWARD chain (removed at teardown), whatever this machine's defaults (Docker's hosts drop).
FORWARD_SYSCTL = "net/ipv4/ip_forward"
FORWARD_RULE = ["FORWARD", "-s", POD_NETWORK, "-d", POD_NETWORK, "-j", "ACCEPT"]
MAX_NODES = 40  # bridges fdra-mn<i> and subnets 10.245.<i>.0/24 stay distinct below this
# Heartbeats stop when a node's kubelet is stopped: the KCM marks the node NotReady after
# this long (its default, 40 s, would make a node-leaving test wait for nothing).
NODE_MONITOR_GRACE = "20s"


@dataclass
class WorkerNode:
    """containerd and a kubelet registered as one Node against a shared control plane.

    Attributes a DRA kubelet plugin needs to be deployed on it (as on NodeCluster):
    `node_name`, `ip`, `kubelet_root`, `plugins_registry_dir`, `plugins_dir`, `cdi_dir`,
    `containerd_socket`, `logs_dir`.
    """

    index: int
    base: Path
    control_plane: ControlPlane
    # Unix socket paths hold 107 bytes: plugin sockets under a pytest tmp dir would not fit.
    kubelet_root: Path
    kubelet_port: int = 0
    _kubelet: Daemon | None = field(default=None, repr=False)
    _containerd: Daemon | None = field(default=None, repr=False)

    @property
    def ip(self) -> str:
        return f"127.0.0.{FIRST_HOST + self.index}"

    @property
    def node_name(self) -> str:
        # The apiserver prefers the Hostname address: it must resolve to the kubelet's address.
        return self.ip

    @property
    def plugins_registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def cdi_dir(self) -> Path:
        """The node's own CDI spec folder (its containerd also reads /etc/cdi)."""
        return self.base / "cdi"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd-state" / "containerd.sock"

    @property
    def logs_dir(self) -> Path:
        return self.base / "logs"

    @property
    def cni_bridge(self) -> str:
        return f"fdra-mn{self.index}"

    @property
    def cgroup_root(self) -> str:
        return f"fabricdra-e2e-node-{self.index}"

    @property
    def kubelet_running(self) -> bool:
        return self._kubelet is not None and self._kubelet.alive()

    # -- start ------------------------------------------------------------------------------

    def start_containerd(self, bin_dir: Path) -> None:
        cni_conf = self.base / "cni" / "net.d"
        # Pods reach the other nodes' pods through the host, which routes between the bridges
        # where it forwards (net.ipv4.ip_forward=1): a pod on one node talks to a pod on
        # another as on a real cluster's pod network (the fabric check's launcher and workers).
        write_cni_config(
            cni_conf,
            self.cni_bridge,
            f"10.245.{self.index}.0/24",
            self.base / "cni" / "ipam",
            routes=[POD_NETWORK],
        )
        self.cdi_dir.mkdir(parents=True)
        config = self.base / "containerd.toml"
        config.write_text(
            _CONTAINERD_TOML.format(
                root=self.base / "containerd",
                state=self.containerd_socket.parent,
                socket=self.containerd_socket,
                pause=images.PAUSE_IMAGE,
                cdi_dirs=json.dumps(["/etc/cdi", str(self.cdi_dir)]),
                cni_conf=cni_conf,
            )
        )
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self._containerd = Daemon(
            f"containerd-{self.index}",
            [str(bin_dir / "containerd"), f"--config={config}"],
            self.logs_dir / "containerd.log",
            env=env,
        )
        self.control_plane.adopt(self._containerd)

    def wait_containerd(self, bin_dir: Path) -> None:
        wait_for(
            lambda: _ctr(bin_dir, self.containerd_socket, "version").returncode == 0,
            timeout=60,
            what="serving its socket",
            daemon=self._containerd,
        )

    def import_images(self, bin_dir: Path, tarballs: list[tuple[Path, str]]) -> None:
        for tarball, ref in tarballs:
            for args in (
                ("images", "import", str(tarball)),
                # pinned: the kubelet's image GC never removes them
                ("images", "label", ref, "io.cri-containerd.pinned=pinned"),
            ):
                done = _ctr(bin_dir, self.containerd_socket, *args)
                if done.returncode != 0:
                    raise HarnessError(
                        f"node {self.node_name}: ctr {' '.join(args)} failed: {done.stderr.strip()}"
                    )

    def start_kubelet(self, bin_dir: Path) -> None:
        """Start the kubelet; its Node registers itself."""
        cp = self.control_plane
        _make_cgroup_root(self.cgroup_root)
        kubeconfig = cp.kubeconfig_for(
            f"kubelet-{self.index}", f"system:node:{self.node_name}", ("system:nodes",)
        )
        self.kubelet_port = free_port()
        config = kubelet_config(
            address=self.ip,
            port=self.kubelet_port,
            containerd_socket=self.containerd_socket,
            client_ca=cp.pki.ca.cert,
            base=self.base,
            cgroup_root=f"/{self.cgroup_root}",
        )
        config_path = self.base / "kubelet.json"
        config_path.write_text(json.dumps(config, indent=2))
        self._kubelet = Daemon(
            f"kubelet-{self.index}",
            [
                str(bin_dir / "kubelet"),
                f"--config={config_path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                # The name is the address: the kubelet takes an IP-shaped hostname as its
                # InternalIP (--node-ip refuses loopback addresses).
                f"--hostname-override={self.node_name}",
                "--v=2",
            ],
            self.logs_dir / "kubelet.log",
        )
        cp.adopt(self._kubelet)

    def wait_ready(self) -> None:
        from kubernetes import client

        def ready() -> bool:
            with self.control_plane.api_client() as api:
                node = client.CoreV1Api(api).read_node(self.node_name)
            status, spec = node.status, node.spec
            conditions = {c.type: c.status for c in (status and status.conditions) or []}
            # ...and the node-lifecycle controller has lifted the not-ready taint.
            return conditions.get("Ready") == "True" and not (spec and spec.taints)

        wait_for(ready, timeout=NODE_READY_TIMEOUT, what="a Ready node", daemon=self._kubelet)

    # -- stop -------------------------------------------------------------------------------

    def stop_kubelet(self) -> None:
        """The node leaves: its kubelet stops heartbeating (its pods keep running, as on a
        node whose kubelet died; teardown removes them)."""
        if self._kubelet is not None:
            self._kubelet.stop()

    def teardown(self, bin_dir: Path | None) -> None:
        """Kubelet, then every pod task, then containerd and the shims it left."""
        self.stop_kubelet()
        socket = self.containerd_socket
        if bin_dir is not None and socket.exists() and (bin_dir / "ctr").exists():
            tasks = _ctr(bin_dir, socket, "tasks", "ls", "-q").stdout.split()
            for task in tasks:
                _ctr(bin_dir, socket, "tasks", "kill", "--signal=SIGKILL", task)
            for task in tasks:
                _ctr(bin_dir, socket, "tasks", "delete", "--force", task)
        if self._containerd is not None:
            self._containerd.stop()
        # Shims reparent to init; they carry our socket on their command line.
        kill_matching(lambda argv: "containerd-shim" in argv[0] and str(socket) in argv)


class MultiNodeCluster:
    """etcd, kube-apiserver, scheduler, KCM, and `nodes` WorkerNodes, all on loopback.

    `.kubeconfig`, `.server`, `.api_client()`, `.control_plane`, `.logs_dir` as on NodeCluster;
    `.nodes` (a list of WorkerNode) and `.node(name)`.
    """

    is_local = True

    def __init__(self, base: Path, *, nodes: int = 3) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise HarnessError(f"a multi-node cluster has 1..{MAX_NODES} nodes, not {nodes}")
        self.base = base
        self.control_plane = ControlPlane(base / "control-plane")
        self.logs_dir = self.control_plane.logs_dir
        # Kubelet roots go in a short folder of their own (plugin socket paths must fit).
        self.kubelet_roots = Path(tempfile.gettempdir()) / f"fdra-mn-{uuid.uuid4().hex[:8]}"
        self.nodes = [
            WorkerNode(i, base / f"node-{i}", self.control_plane, self.kubelet_roots / str(i))
            for i in range(nodes)
        ]
        self._lock_fd: int | None = None
        self._bin_dir: Path | None = None
        self._saved: dict[str, Any] = {}
        self.start_seconds = 0.0

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    def api_client(self) -> Any:
        return self.control_plane.api_client()

    def node(self, name: str) -> WorkerNode:
        for n in self.nodes:
            if n.node_name == name:
                return n
        raise KeyError(name)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise HarnessError(
                "the multi-node cluster needs root (containerd, runc and the kubelets mount, "
                "create cgroups and set sysctls)"
            )
        if self._lock_fd is None:
            self.take_machine()
        began = time.monotonic()  # what start-up costs, not the wait for the machine
        atexit.register(self.stop)  # pods, mounts and sysctls outlive the daemons
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def stop(self, *, release: bool = True) -> None:
        """Stop everything and undo what start() did to the machine. Idempotent.

        `release=False` keeps the machine lock (to look at the machine before another
        cluster may start); release_machine() lets it go.
        """
        atexit.unregister(self.stop)
        try:
            for node in self.nodes:
                node.teardown(self._bin_dir)
            _kill_pod_processes()  # whatever escaped its task (the lock makes them ours)
            self.control_plane.stop()
            for folder in (self.base, self.kubelet_roots):
                _unmount_under(folder)
            shutil.rmtree(self.kubelet_roots, ignore_errors=True)
            for node in self.nodes:
                with contextlib.suppress(FileNotFoundError):
                    _run(["ip", "link", "del", node.cni_bridge])
                _remove_kubepods_cgroups(node.cgroup_root)
            _remove_container_log_links(self.base)
            if "sysctls" in self._saved:
                _restore_sysctls(self._saved.pop("sysctls"))
            if self._saved.pop("forward_rule", None):
                _run(["iptables", "-w", "-D", *FORWARD_RULE])
            if "iptables_chains" in self._saved:
                _remove_kubelet_chains(keep=self._saved.pop("iptables_chains"))
        finally:
            if release:
                self.release_machine()

    # -- start ------------------------------------------------------------------------------

    def take_machine(self) -> None:
        """Wait for the machine-wide node-cluster lock (start() takes it if not held)."""
        self._lock_fd = take_machine_lock(
            "multi-node cluster",
            "; multi-node tests run in a module of their own, before the single-node ones",
        )
        running = _running_daemons(DEFAULT_BASE / "cluster.json")
        if running:
            self.release_machine()
            raise HarnessError(
                f"a cluster started by e2e/cluster/up.sh is running (pids {running}): stop it "
                "with e2e/cluster/down.sh first"
            )

    def release_machine(self) -> None:
        if self._lock_fd is not None:
            release_machine_lock(self._lock_fd)
            self._lock_fd = None

    def _start(self) -> None:
        self._bin_dir = bin_dir = binaries.ensure(binaries.CONTROL_PLANE + binaries.NODE, node=True)
        sweep_crashed_runs()
        if self.base.exists():
            shutil.rmtree(self.base)
        self.base.mkdir(parents=True)
        self.kubelet_roots.mkdir(mode=0o700)
        forwarding = Path("/proc/sys", FORWARD_SYSCTL)
        self._saved = {
            "sysctls": {**_read_sysctls(), FORWARD_SYSCTL: forwarding.read_text().strip()},
            "iptables_chains": _kubelet_chains(),
        }
        forwarding.write_text("1")
        if _run(["iptables", "-w", "-C", *FORWARD_RULE]).returncode != 0:
            added = _run(["iptables", "-w", "-I", *FORWARD_RULE])
            if added.returncode != 0:
                raise HarnessError(f"iptables -I {' '.join(FORWARD_RULE)}: {added.stderr.strip()}")
            self._saved["forward_rule"] = True
        self.control_plane._bin_dir = bin_dir

        # Without systemd nothing makes / shared; the kubelets' mount propagation needs it.
        _run(["mount", "--make-rshared", "/"])
        self.control_plane.start()
        KubeScheduler(self.control_plane).start()
        KubeControllerManager(
            self.control_plane, node_monitor_grace_period=NODE_MONITOR_GRACE
        ).start()
        image_dir = self.base / "images"
        image_dir.mkdir()
        tarballs = [
            (images.pause_image(image_dir), images.PAUSE_IMAGE),
            (images.busybox_image(image_dir), images.TEST_IMAGE),
        ]
        Path("/etc/cdi").mkdir(parents=True, exist_ok=True)
        # Every node's daemons start together; each wait below overlaps the others' start-up.
        for node in self.nodes:
            node.start_containerd(bin_dir)
        for node in self.nodes:
            node.wait_containerd(bin_dir)
            node.import_images(bin_dir, tarballs)
        # Kubelets start one at a time: each binds the device-plugin registration socket at
        # a fixed path (/var/lib/kubelet/device-plugins/kubelet.sock, whatever --root-dir
        # says) after clearing that folder, so two starting together raced and one exited
        # with "bind: address already in use" (seen in a full e2e run). Once a node is Ready
        # its kubelet is past that point; the next one clears the socket and binds its own.
        for node in self.nodes:
            node.start_kubelet(bin_dir)
            node.wait_ready()


def sweep_crashed_runs() -> None:
    """Undo what a killed earlier run left behind: its daemons died with it (parent-death
    signal), but its pods, mounts, bridges and cgroup roots outlive them.

    Call only while holding the machine lock: then no other node cluster uses these names.
    """
    _kill_pod_processes()
    for link in Path("/sys/class/net").iterdir():
        if re.fullmatch(r"fdra-mn\d+", link.name):
            _run(["ip", "link", "del", link.name])
    for root in {p.name for p in CGROUP_ROOT.glob("*/fabricdra-e2e-node-*")}:
        _remove_kubepods_cgroups(root)
    for folder in Path(tempfile.gettempdir()).glob("fdra-mn-*"):
        _unmount_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _make_cgroup_root(name: str) -> None:
    """The kubelet refuses a cgroup root that does not exist in every v1 hierarchy.

    cpuset children start with no CPUs and no memory nodes: copy the parent's, or nothing
    placed below could run.
    """
    for hierarchy in CGROUP_ROOT.iterdir():
        if hierarchy.is_symlink() or not hierarchy.is_dir():
            continue
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent = hierarchy / knob
            if parent.exists() and not (path / knob).read_text().strip():
                (path / knob).write_text(parent.read_text())


__all__ = ["FIRST_HOST", "MultiNodeCluster", "WorkerNode", "sweep_crashed_runs"]
