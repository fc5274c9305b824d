"""Running NVIDIA IMEX for one ComputeDomain on one node (no API calls here).

`ImexSupervisor.step(peers)` is one pass of the daemon loop: it writes the IMEX config and
the nodes config, starts the `nvidia-imex` process, restarts it with a backoff when it died, and
asks `nvidia-imex-ctl -q` whether the local daemon is READY. It returns a `State` the caller
reports; on a host without the IMEX binary the state says so instead of failing silently.

Joins reload in place, never restart (as NVIDIA's daemon does): the nodes config lists stable
peer *names*, one per index slot (`fabricdra-imex-<index>`, `max_peers` of them), fixed for the
daemon's life; the names resolve through a block this supervisor keeps in the hosts file.
A peer joining, leaving or changing its IP rewrites only that block and sends IMEX `SIGUSR1`,
which makes it resolve its peers again; the connections to the other peers, and the memory
they imported, stay. Before, every join rewrote the nodes file and restarted IMEX on every node
(18 nodes joining one by one: 153 restarts, each dropping the peers' imports).

The interface used is IMEX's documented one: `nvidia-imex -c <config>` with
`IMEX_NODE_CONFIG_FILE`, `SERVER_PORT`, `IMEX_CMD_ENABLED`/`IMEX_CMD_PORT` in the config, and
`nvidia-imex-ctl -c <config> -q` printing `READY` once the local daemon serves.

The command service listens on the node's own address only (`IMEX_CMD_BIND_INTERFACE_IP`, as
NVIDIA's daemon writes it; left empty, IMEX binds it to every interface of the host network),
loopback when no address is known. IMEX is not started on a driver older than
MIN_RELOAD_DRIVER, below which NVIDIA does not support the named peers and SIGUSR1 reloads
joins rely on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fabricdra.kubeletplugin.kubelet.cdi import write_atomic

from .imexfiles import MIN_RELOAD_DRIVER, older_than


@dataclass(frozen=True)
class State:
    ready: bool
    message: str


@dataclass
class ImexSettings:
    config_dir: Path  # /imexd in the daemon pod (a per-domain host folder)
    imex_bin: str = "nvidia-imex"
    imex_ctl: str = "nvidia-imex-ctl"
    bind_ip: str = ""  # the node's address on the fabric network (the pod IP, host network)
    server_port: int = 50000
    cmd_port: int = 50005
    # Where the peer names resolve: the CLI passes the pod's /etc/hosts (kubelet's per-pod
    # copy, writable); None = `hosts` in config_dir (tests, and a safe default).
    hosts_file: Path | None = None
    max_peers: int = 18  # name slots in the nodes config: an NVL72 rack's compute trays
    restart_backoff: tuple[float, ...] = field(default=(0.5, 1.0, 2.0, 5.0, 10.0))
    # A running nvidia-imex that answers no `nvidia-imex-ctl -q` (it times out, or finds no
    # one listening) for this long is hung, not starting: killed and restarted. A process
    # that exits is restarted anyway; one that hangs would otherwise stay for good.
    hang_seconds: float = 60.0
    # The loaded driver's version (the plugin passes it, imexfiles.py); "" = not known, then
    # not checked (nvidia-imex itself is then the judge).
    driver_version: str = ""
    # Where the driver's libraries are mounted: LD_LIBRARY_PATH for IMEX and its control
    # tool only (not for this Python process). "" = the image's own library path.
    library_path: str = ""


def render_config(settings: ImexSettings) -> str:
    nodes = settings.config_dir / "nodes.cfg"
    # Empty means "every interface" to IMEX's command service: loopback, never that.
    cmd_ip = settings.bind_ip or "127.0.0.1"
    lines = [
        "# Written by fabricdra imex-daemon; rewritten on every change.",
        "LOG_FILE_NAME=",  # stderr: the pod's log
        "LOG_LEVEL=4",
        "DAEMONIZE=0",
        f"BIND_INTERFACE_IP={settings.bind_ip}",
        f"SERVER_PORT={settings.server_port}",
        "IMEX_CMD_ENABLED=1",
        f"IMEX_CMD_BIND_INTERFACE_IP={cmd_ip}",
        f"IMEX_CMD_PORT={settings.cmd_port}",
        f"IMEX_NODE_CONFIG_FILE={nodes}",
        "IMEX_WAIT_FOR_QUORUM=RECOVERY",
        "IMEX_NODE_DISCONNECTED_GRACE_TIME=-1",
    ]
    return "\n".join(lines) + "\n"


HOSTS_BEGIN = "# fabricdra imex-daemon peers: begin (rewritten on every change)"
HOSTS_END = "# fabricdra imex-daemon peers: end"


def peer_name(index: int) -> str:
    return f"fabricdra-imex-{index}"


def render_nodes(slots: int) -> str:
    return "".join(f"{peer_name(i)}\n" for i in range(slots))


def render_hosts(current: str, peers: Mapping[int, str]) -> str:
    """`current` with our block replaced by one line per known peer (the rest kept as is)."""
    kept, inside = [], False
    for line in current.splitlines():
        if line == HOSTS_BEGIN:
            inside = True
        elif line == HOSTS_END:
            inside = False
        elif not inside:
            kept.append(line)
    block = [HOSTS_BEGIN, *(f"{ip}\t{peer_name(i)}" for i, ip in sorted(peers.items())), HOSTS_END]
    return "\n".join([*kept, *block]) + "\n"


def as_slots(peers: Mapping[int, str] | Sequence[str]) -> dict[int, str]:
    """Peers by index slot; a plain list counts from 0."""
    if isinstance(peers, Mapping):
        return dict(peers)
    return dict(enumerate(peers))


class ImexSupervisor:
    def __init__(self, settings: ImexSettings) -> None:
        self.settings = settings
        self.config_path = settings.config_dir / "imexd.cfg"
        self.nodes_path = settings.config_dir / "nodes.cfg"
        self.stderr_path = settings.config_dir / "nvidia-imex.stderr"
        self._proc: subprocess.Popen[bytes] | None = None
        self._peers: dict[int, str] | None = None
        self._slots = 0
        self.reloads = 0  # SIGUSR1s sent (joins, leaves, IP changes): for tests and logs
        self._failures = 0
        self._next_start = 0.0
        self._last_exit = ""
        self._answered_at = 0.0  # monotonic: the running IMEX's start or its last answer
        self.answered = False  # whether the last query reached an IMEX daemon

    def _find(self, name: str) -> str | None:
        if os.sep in name:
            return name if os.access(name, os.X_OK) else None
        return shutil.which(name)

    def step(self, peers: Mapping[int, str] | Sequence[str]) -> State:
        """One pass; `peers`: the domain's node IPs (this node included) by index slot."""
        binary = self._find(self.settings.imex_bin)
        if binary is None:
            self.stop()
            return State(
                False,
                f"{self.settings.imex_bin} not found: this host has no IMEX "
                "binary (install the NVIDIA IMEX package or use imexMode: host)",
            )
        refused = self.driver_refusal()
        if refused is not None:
            self.stop()
            return refused
        if not peers:
            if self.running():
                # Missing from status.nodes for a moment (a controller failover, a stale
                # read): stopping IMEX would drop every peer's imports; keep the last peers.
                return State(
                    False,
                    "this node is missing from the domain's status.nodes; "
                    "IMEX keeps running with its last peers",
                )
            return State(False, "waiting for the controller to list this node's peers")
        slots_by_index = as_slots(peers)
        self.settings.config_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_path, render_config(self.settings).encode())
        slots = max(self.settings.max_peers, max(slots_by_index) + 1)
        if slots != self._slots:
            # More peers than slots (a domain larger than the fabric was thought to be): the
            # only change that needs a restart, as IMEX reads its nodes file at start.
            write_atomic(self.nodes_path, render_nodes(slots).encode())
            if self._proc is not None:
                self.stop()
                self._next_start = 0.0
            self._slots = slots
        if slots_by_index != self._peers:
            self._write_hosts(slots_by_index)
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGUSR1)  # re-resolve the peers; keep the rest
                self.reloads += 1
            self._peers = slots_by_index
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            err = _tail(self.stderr_path).strip().splitlines()
            self._last_exit = f"nvidia-imex exited with status {code}" + (
                f": {err[-1]}" if err else ""
            )
            self._proc = None
            backoff = self.settings.restart_backoff
            self._next_start = time.monotonic() + backoff[min(self._failures, len(backoff) - 1)]
            self._failures += 1
        if self._proc is None:
            if time.monotonic() < self._next_start:
                return State(False, self._last_exit + "; restarting")
            # stderr to a file, not a pipe: nobody reads a pipe while IMEX runs, and a full
            # one (64 KiB of warnings) would block IMEX forever while it looks alive.
            with self.stderr_path.open("wb") as err_file:
                self._proc = subprocess.Popen(
                    [binary, "-c", str(self.config_path)],
                    env=self._child_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err_file,
                )
            self._answered_at = time.monotonic()
        ready = self.query()
        if self.answered:
            self._answered_at = time.monotonic()
        elif time.monotonic() - self._answered_at >= self.settings.hang_seconds:
            return self._kill_hung()
        if ready.ready:
            self._failures = 0
            self._last_exit = ""
        elif self._last_exit:
            return State(False, f"{self._last_exit}; now: {ready.message}")
        return ready

    def _kill_hung(self) -> State:
        """IMEX runs but has answered nothing for `hang_seconds`: kill it (SIGKILL: a hung
        process may not act on SIGTERM) and restart it after the usual backoff."""
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait()
        self._last_exit = (
            f"nvidia-imex answered no query for {self.settings.hang_seconds:g}s while running "
            "(hung); killed"
        )
        self._proc = None
        backoff = self.settings.restart_backoff
        self._next_start = time.monotonic() + backoff[min(self._failures, len(backoff) - 1)]
        self._failures += 1
        return State(False, self._last_exit + "; restarting")

    def driver_refusal(self) -> State | None:
        """Not ready, and why, when the driver is too old for this daemon's reloads."""
        version = self.settings.driver_version
        if not version or not older_than(version):
            return None
        return State(
            False,
            f"NVIDIA driver {version} is older than {MIN_RELOAD_DRIVER}, the first NVIDIA "
            "supports IMEX with peers named by host name and re-resolved on SIGUSR1, which this "
            "daemon relies on to add peers without a restart; IMEX is not started: upgrade the "
            "driver or use imexMode: host",
        )

    def _child_env(self) -> dict[str, str] | None:
        if not self.settings.library_path:
            return None  # inherit
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (self.settings.library_path, env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    @property
    def hosts_path(self) -> Path:
        return self.settings.hosts_file or self.settings.config_dir / "hosts"

    def _write_hosts(self, peers: Mapping[int, str]) -> None:
        path = self.hosts_path
        try:
            current = path.read_text()
        except FileNotFoundError:
            current = ""
        # In place, not by rename: in a pod /etc/hosts is a bind mount, which a rename over
        # it cannot replace.
        with path.open("w") as f:
            f.write(render_hosts(current, peers))

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def pid(self) -> int | None:
        return self._proc.pid if self.running() and self._proc is not None else None

    def query(self) -> State:
        """`nvidia-imex-ctl -c <config> -q`: READY or what it said instead."""
        ctl = self._find(self.settings.imex_ctl)
        if ctl is None:
            return State(False, f"{self.settings.imex_ctl} not found")
        try:
            done = subprocess.run(
                [ctl, "-c", str(self.config_path), "-q"],
                env=self._child_env(),
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.answered = False
            return State(False, "nvidia-imex-ctl -q did not answer within 5 s")
        answer = done.stdout.strip()
        # UNAVAILABLE (or nothing): the tool reached no IMEX daemon.
        self.answered = answer not in ("", "UNAVAILABLE")
        if answer == "READY":
            return State(True, "READY")
        return State(False, f"IMEX not ready: {answer or done.stderr.strip() or done.returncode}")

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None


def _tail(path: Path, limit: int = 4096) -> str:
    """The last `limit` bytes of a file (the exit reason is IMEX's last stderr line)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
