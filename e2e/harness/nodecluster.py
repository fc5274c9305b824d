"""A one-node Kubernetes cluster on this machine: the control plane plus containerd and a kubelet.

Used in-process by the `node_cluster` pytest fixture, and detached (daemons outliving the
Python process, pids in <base>/cluster.json) by e2e/cluster/up.sh and down.sh:

    python -m e2e.harness.nodecluster up   [--base DIR]   # last line: the admin kubeconfig
    python -m e2e.harness.nodecluster down [--base DIR]

Every trap of the CI VM (cgroup v1 hybrid, no systemd, negative oom_score_adj refused, a private
root mount) is handled here; docs/testing.md explains each. Only one node cluster runs on a
machine at a time (cgroup /kubepods and the kernel sysctls are machine-wide): a second one
waits on LOCK_PATH.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from e2e.harness import binaries, images
from e2e.harness.controlplane import ControlPlane, KubeControllerManager, KubeScheduler
from e2e.harness.errors import HarnessError
from e2e.harness.poll import wait_for
from e2e.harness.process import (
    Daemon,
    free_port,
    kill_matching,
    log_tail,
    stop_recorded,
)

DEFAULT_BASE = Path("/var/lib/fabricdra-e2e")
LOCK_PATH = Path("/run/fabricdra-e2e.lock")
LOCK_WAIT = 1200.0  # seconds another session's cluster may keep us waiting
NODE_READY_TIMEOUT = 240.0
# CDI spec dirs containerd reads (its defaults, stated explicitly). Plugins write to the second.
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# What the kubelet's setupKernelTunables overwrites; down restores what up found.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
CNI_BRIDGE = "fdra-e2e0"
# Chains the kubelet adds to the host's iptables (route_localnet guard and its canaries).
KUBELET_CHAINS = {
    "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
    "mangle": ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"),
}
IPTABLES = ("iptables", "ip6tables")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What in this process holds LOCK_PATH (NodeCluster or the multi-node cluster): a second
# cluster in one pytest session would wait on its own process; it fails at once instead.
LOCK_HOLDER: list[str] = []


def take_machine_lock(holder: str, hint: str = "") -> int:
    """Wait for the machine-wide node-cluster lock; returns its fd (release_machine_lock).

    One node cluster of any kind runs on a machine at a time: cgroups, the CNI bridges and the
    kernel sysctls are machine-wide. A second cluster in the same process would wait on itself.
    """
    if LOCK_HOLDER:
        raise HarnessError(
            f"this process already runs a {LOCK_HOLDER[0]} (it holds {LOCK_PATH}){hint}"
        )
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise HarnessError(
                    f"another node cluster holds {LOCK_PATH} for over {LOCK_WAIT:.0f}s"
                ) from None
            time.sleep(2)
    LOCK_HOLDER.append(holder)
    return fd


def release_machine_lock(fd: int) -> None:
    os.close(fd)  # closing drops the flock
    LOCK_HOLDER.clear()


class NodeCluster:
    """etcd, kube-apiserver, scheduler, KCM, containerd and a kubelet, all on loopback.

    Attributes other harness users rely on (the DRA kubelet-plugin tests deploy against them):
    `kubeconfig`, `server`, `node_name`, `kubelet_root`, `plugins_registry_dir`, `plugins_dir`,
    `cdi_dir`, `containerd_socket`, `logs_dir`, `is_local` (True: the node is this machine).
    """

    is_local = True

    def __init__(
        self,
        base: Path = DEFAULT_BASE,
        *,
        node_name: str = "127.0.0.1",
        detached: bool = False,
    ) -> None:
        # node_name must resolve to 127.0.0.1: the apiserver reaches the kubelet (logs, exec)
        # at the node's Hostname address, and everything here listens on loopback only.
        self.base = base
        self.node_name = node_name
        self.detached = detached
        self.state_file = base / "cluster.json"
        self.control_plane = ControlPlane(
            base / "control-plane", detached=detached, on_adopt=self._record
        )
        self.logs_dir = self.control_plane.logs_dir
        self.kubelet_root = base / "kubelet"
        self.plugins_registry_dir = self.kubelet_root / "plugins_registry"
        self.plugins_dir = self.kubelet_root / "plugins"
        self.cdi_dir = Path(CDI_SPEC_DIRS[1])
        self.containerd_root = base / "containerd"
        self.containerd_state = base / "containerd-state"
        self.containerd_socket = self.containerd_state / "containerd.sock"
        self.kubelet_port = 0
        self._lock_fd: int | None = None
        self._state: dict[str, Any] = {"daemons": []}
        self._kubelet: Daemon | None = None
        self._containerd: Daemon | None = None

    # -- public surface ----------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    def api_client(self) -> Any:
        return self.control_plane.api_client()

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
                "the single-node cluster needs root (containerd, runc and the kubelet mount, "
                "create cgroups and set sysctls); the control-plane fixtures do not"
            )
        self._take_lock()
        if not self.detached:
            # Pods, shims, mounts and sysctls outlive the daemons: undo them even when the
            # session ends without running fixture teardown.
            atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop everything and undo what start() did to the machine. Idempotent."""
        atexit.unregister(self.stop)
        try:
            _teardown(self.base, self._state, live=self._live_daemons())
            self.control_plane.stop()  # reaps what _teardown signalled
        finally:
            self._release_lock()

    # -- start ------------------------------------------------------------------------------

    def _live_daemons(self) -> dict[int, Daemon]:
        live = {d.pid: d for d in self.control_plane.daemons}
        for d in (self._kubelet, self._containerd):
            if d is not None:
                live[d.pid] = d
        return live

    def _record(self, daemon: Daemon) -> None:
        self._state["daemons"].append(
            {"name": daemon.name, "pid": daemon.pid, "program": Path(daemon.argv[0]).name}
        )
        self._save_state()

    def _save_state(self) -> None:
        self.state_file.write_text(json.dumps(self._state, indent=2) + "\n")

    def _take_lock(self) -> None:
        self._lock_fd = take_machine_lock("single-node cluster")
        running = _running_daemons(DEFAULT_BASE / "cluster.json")
        if running and self.base != DEFAULT_BASE:
            self._release_lock()
            raise HarnessError(
                f"a cluster started by e2e/cluster/up.sh is running (pids {running}): stop it "
                "with e2e/cluster/down.sh, or use it with "
                f"FABRICDRA_E2E_KUBECONFIG={DEFAULT_BASE}/control-plane/admin.kubeconfig"
            )

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            release_machine_lock(self._lock_fd)
            self._lock_fd = None

    def _start(self) -> None:
        bin_dir = binaries.ensure(binaries.CONTROL_PLANE + binaries.NODE, node=True)
        if _running_daemons(self.state_file):
            raise HarnessError(f"a cluster from {self.state_file} is still running: stop it first")
        if self.base.exists():
            _teardown(self.base, _load_state(self.state_file), live={})  # leftovers of a crash
            shutil.rmtree(self.base)
        self.base.mkdir(parents=True)
        self._state = {
            "daemons": [],
            "node": self.node_name,
            "sysctls": _read_sysctls(),
            "iptables_chains": _kubelet_chains(),  # left alone at teardown if already there
        }
        self._save_state()
        self.control_plane._bin_dir = bin_dir

        # Without systemd nothing makes / shared; the kubelet's mount propagation needs it.
        _run(["mount", "--make-rshared", "/"])
        self.control_plane.start()
        KubeScheduler(self.control_plane).start()
        KubeControllerManager(self.control_plane).start()
        self._start_containerd(bin_dir)
        self._import_images(bin_dir)
        self._start_kubelet(bin_dir)
        self._wait_node_ready()

    def _start_containerd(self, bin_dir: Path) -> None:
        cni_conf = self.base / "cni" / "net.d"
        write_cni_config(cni_conf, CNI_BRIDGE, "10.244.0.0/24", self.base / "cni" / "ipam")
        config = self.base / "containerd.toml"
        config.write_text(
            _CONTAINERD_TOML.format(
                root=self.containerd_root,
                state=self.containerd_state,
                socket=self.containerd_socket,
                pause=images.PAUSE_IMAGE,
                cdi_dirs=json.dumps(list(CDI_SPEC_DIRS)),
                cni_conf=cni_conf,
            )
        )
        for d in CDI_SPEC_DIRS:
            Path(d).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self._containerd = Daemon(
            "containerd",
            [str(bin_dir / "containerd"), f"--config={config}"],
            self.logs_dir / "containerd.log",
            env=env,
            die_with_parent=not self.detached,
        )
        wait_for(
            lambda: self._ctr(bin_dir, "version").returncode == 0,
            timeout=60,
            what="serving its socket",
            daemon=self._containerd,
        )
        self.control_plane.adopt(self._containerd)

    def _ctr(self, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return _ctr(bin_dir, self.containerd_socket, *args)

    def import_image(self, archive: Path) -> None:
        """Load an image archive (docker-archive or OCI, e.g. deployments/container/build.sh's)
        into the node's containerd, where pods with imagePullPolicy Never find it."""
        done = self._ctr(binaries.bin_dir(), "images", "import", str(archive))
        if done.returncode != 0:
            raise HarnessError(f"ctr images import {archive} failed: {done.stderr.strip()}")

    def _import_images(self, bin_dir: Path) -> None:
        image_dir = self.base / "images"
        image_dir.mkdir()
        for tarball, ref in (
            (images.pause_image(image_dir), images.PAUSE_IMAGE),
            (images.busybox_image(image_dir), images.TEST_IMAGE),
        ):
            for args in (
                ("images", "import", str(tarball)),
                # pinned: the kubelet's image GC never removes them
                ("images", "label", ref, "io.cri-containerd.pinned=pinned"),
            ):
                done = self._ctr(bin_dir, *args)
                if done.returncode != 0:
                    raise HarnessError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")

    def _start_kubelet(self, bin_dir: Path) -> None:
        cp = self.control_plane
        kubeconfig = cp.kubeconfig_for(
            "kubelet", f"system:node:{self.node_name}", ("system:nodes",)
        )
        self.kubelet_port = free_port()
        config = kubelet_config(
            address="127.0.0.1",
            port=self.kubelet_port,
            containerd_socket=self.containerd_socket,
            client_ca=cp.pki.ca.cert,
            base=self.base,
        )
        config_path = self.base / "kubelet.json"
        config_path.write_text(json.dumps(config, indent=2))
        self._kubelet = Daemon(
            "kubelet",
            [
                str(bin_dir / "kubelet"),
                f"--config={config_path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                f"--hostname-override={self.node_name}",
                "--v=2",
            ],
            self.logs_dir / "kubelet.log",
            die_with_parent=not self.detached,
        )
        cp.adopt(self._kubelet)

    def _wait_node_ready(self) -> None:
        from kubernetes import client

        def ready() -> bool:
            with self.api_client() as api:
                node = client.CoreV1Api(api).read_node(self.node_name)
            status, spec = node.status, node.spec
            conditions = {c.type: c.status for c in (status and status.conditions) or []}
            # ...and the node-lifecycle controller has lifted the not-ready taint.
            return conditions.get("Ready") == "True" and not (spec and spec.taints)

        wait_for(ready, timeout=NODE_READY_TIMEOUT, what="a Ready node", daemon=self._kubelet)


def write_cni_config(
    conf_dir: Path, bridge: str, subnet: str, ipam_dir: Path, routes: Sequence[str] = ()
) -> None:
    """A bridge network for the node's pods.

    The node stays NotReady without a CNI config, even if every pod uses host networking.
    `routes`: networks the pods reach through their bridge's gateway (the host), e.g. the
    other nodes' pod subnets; without them a pod reaches its own subnet only.
    """
    ipam: dict[str, Any] = {
        "type": "host-local",
        "ranges": [[{"subnet": subnet}]],
        "dataDir": str(ipam_dir),
    }
    if routes:
        ipam["routes"] = [{"dst": r} for r in routes]  # via the gateway: the bridge's address
    conf_dir.mkdir(parents=True)
    (conf_dir / "10-fabricdra-e2e.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "fabricdra-e2e",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "ipam": ipam,
                    }
                ],
            },
            indent=2,
        )
    )


def kubelet_config(
    *,
    address: str,
    port: int,
    containerd_socket: Path,
    client_ca: Path,
    base: Path,
    cgroup_root: str | None = None,
) -> dict[str, Any]:
    """The KubeletConfiguration of a harness node listening on `address`.

    `cgroup_root`: where the node's /kubepods tree goes (default: the machine's root); several
    kubelets on one machine each need their own, or each would remove the others' pods.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "healthzBindAddress": address,
        "healthzPort": free_port(),
        "readOnlyPort": 0,
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        # No systemd and cgroup v1 hybrid: cgroupfs, and failCgroupV1 (1.35+ defaults to
        # refusing v1; the setting exists only in the config file).
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        # The VM refuses negative oom_score_adj; the default -999 would be refused too.
        "oomScoreAdj": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "imageGCHighThresholdPercent": 100,  # never GC the imported images
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(base / "pod-logs"),
        "volumePluginDir": str(base / "volume-plugins"),
    }
    if cgroup_root is not None:
        config["cgroupRoot"] = cgroup_root
    return config


_CONTAINERD_TOML = """\
version = 3
root = "{root}"
state = "{state}"
# NRI would listen on the machine-wide /var/run/nri/nri.sock; nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{socket}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = {cdi_dirs}
  # The VM refuses negative oom_score_adj: clamp to containerd's own score, or every pod
  # hangs in ContainerCreating ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, not the machine-wide /var/run/netns: teardown
  # unmounts everything under the base dir, which frees them and their veth pairs.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni_conf}"
"""


# -- teardown, shared by the fixture (live daemons) and down.sh (recorded pids) --------------


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _ctr(bin_dir: Path, socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(bin_dir / "ctr"), f"--address={socket}", "--namespace=k8s.io", *args])


def _load_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"daemons": []}
    return state


def _running_daemons(state_file: Path) -> list[int]:
    running = []
    for d in _load_state(state_file).get("daemons", []):
        with contextlib.suppress(OSError):
            argv0 = Path(f"/proc/{d['pid']}/cmdline").read_bytes().split(b"\0")[0]
            if Path(argv0.decode()).name == d["program"]:
                running.append(d["pid"])
    return running


def _read_sysctls() -> dict[str, str]:
    return {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS}


def _restore_sysctls(saved: dict[str, str]) -> None:
    for key, value in saved.items():
        with contextlib.suppress(OSError):
            Path("/proc/sys", key).write_text(value)


def _teardown(base: Path, state: dict[str, Any], *, live: dict[int, Daemon]) -> None:
    """Stop the recorded daemons (kubelet first) and clean the machine after them."""
    daemons = state.get("daemons", [])

    def stop(name: str) -> None:
        for d in reversed(daemons):
            if d["name"] == name:
                if d["pid"] in live:
                    live[d["pid"]].stop()
                else:
                    stop_recorded(d["pid"], d["program"])

    socket = base / "containerd-state" / "containerd.sock"
    stop("kubelet")
    # Pods: kill every task (containers and pause sandboxes) while containerd still runs, so
    # their shims exit and their mounts are released.
    with contextlib.suppress(HarnessError):
        bin_dir = binaries.bin_dir()
        if socket.exists() and (bin_dir / "ctr").exists():
            tasks = _ctr(bin_dir, socket, "tasks", "ls", "-q").stdout.split()
            for task in tasks:
                _ctr(bin_dir, socket, "tasks", "kill", "--signal=SIGKILL", task)
            for task in tasks:
                _ctr(bin_dir, socket, "tasks", "delete", "--force", task)
    stop("containerd")
    # Shims reparent to init; they carry our socket on their command line.
    kill_matching(lambda argv: "containerd-shim" in argv[0] and str(socket) in argv)
    _kill_pod_processes()
    for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
        stop(name)
    _unmount_under(base)
    with contextlib.suppress(FileNotFoundError):
        _run(["ip", "link", "del", CNI_BRIDGE])
    _remove_kubepods_cgroups()
    _remove_container_log_links(base)
    if "sysctls" in state:
        _restore_sysctls(state["sysctls"])
    if "iptables_chains" in state:
        _remove_kubelet_chains(keep=state["iptables_chains"])


def _kubelet_chains() -> list[str]:
    """The kubelet's chains present now, as "iptables/filter/KUBE-FIREWALL" strings."""
    present = []
    for tool in IPTABLES:
        if shutil.which(tool) is None:
            continue
        for table, chains in KUBELET_CHAINS.items():
            for chain in chains:
                if _run([tool, "-w", "-t", table, "-S", chain]).returncode == 0:
                    present.append(f"{tool}/{table}/{chain}")
    return present


def _remove_kubelet_chains(*, keep: list[str]) -> None:
    for entry in _kubelet_chains():
        if entry in keep:
            continue
        tool, table, chain = entry.split("/")
        if chain == "KUBE-FIREWALL":
            for parent in ("INPUT", "OUTPUT"):
                while _run([tool, "-w", "-t", table, "-D", parent, "-j", chain]).returncode == 0:
                    pass
        _run([tool, "-w", "-t", table, "-F", chain])
        _run([tool, "-w", "-t", table, "-X", chain])


def _kill_pod_processes() -> None:
    """Whatever is still in the kubelet's pod cgroups (only one node cluster runs at a time)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if "/kubepods" in (entry / "cgroup").read_text():
                os.kill(int(entry.name), 9)


def _unmount_under(base: Path) -> None:
    prefix = str(base.resolve()) + "/"
    targets = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4].encode().decode("unicode_escape")
            if target.startswith(prefix):
                targets.append(target)
    for target in sorted(set(targets), key=len, reverse=True):
        _run(["umount", "-l", target])


def _remove_kubepods_cgroups(top_name: str = "kubepods") -> None:
    """Remove the cgroup tree `top_name` (relative to each hierarchy's root), deepest first."""
    with contextlib.suppress(OSError):
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / top_name
            if not top.is_dir():
                continue
            for dirpath, _, _ in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _remove_container_log_links(base: Path) -> None:
    """The kubelet links every container log into the fixed /var/log/containers."""
    links = Path("/var/log/containers")
    with contextlib.suppress(OSError):
        for link in links.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and str(link.readlink()).startswith(str(base)):
                    link.unlink()


# -- command line (e2e/cluster/up.sh, down.sh) -----------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.nodecluster")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE, help="working directory")
    parser.add_argument("--node-name", default="127.0.0.1")
    parser.add_argument(
        "--install",
        action="store_true",
        help="up: also install fabricdra with its chart on the sample node (e2e.harness.install)",
    )
    args = parser.parse_args(argv)
    base: Path = args.base.resolve()
    if args.action == "down":
        state = _load_state(base / "cluster.json")
        _teardown(base, state, live={})
        if base.exists():
            shutil.rmtree(base)
        print(f"stopped the cluster in {base}", file=sys.stderr)
        return 0
    running = _running_daemons(base / "cluster.json")
    if running:
        print(f"already up (pids {running})", file=sys.stderr)
        print(base / "control-plane" / "admin.kubeconfig")
        return 0
    cluster = NodeCluster(base, node_name=args.node_name, detached=True)
    try:
        cluster.start()
    except HarnessError as e:
        print(f"up failed: {e}", file=sys.stderr)
        return 1
    cluster._release_lock()
    print(f"node {cluster.node_name} Ready; logs in {cluster.logs_dir}", file=sys.stderr)
    if args.install:
        from e2e.harness.install import install_sample

        try:
            install_sample(cluster, base / "fabricdra")
        except HarnessError as e:
            print(f"install failed (the cluster stays up): {e}", file=sys.stderr)
            print(cluster.kubeconfig)
            return 1
    print(cluster.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DEFAULT_BASE", "NodeCluster", "log_tail"]
