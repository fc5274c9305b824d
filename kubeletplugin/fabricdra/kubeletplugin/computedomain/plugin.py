"""The compute-domain.fabricdra.io node plugin: its driver behind the shared plugin server, the
node label that tells the controller to publish this node's devices, and the host IMEX report.

    plugin = ComputeDomainPlugin(PluginConfig(node_name="gpu-7"), api_client)
    plugin.run(stop_event)      # returns when stop_event is set (SIGTERM/SIGINT in the CLI)

Built like the devices plugin (`fabricdra.kubeletplugin.agent`): a driver module (`driver.py`:
what prepare and unprepare do) and a plugin module (this one: the run loop), so the CLI only
parses flags and a third driver is one more package of the same shape.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.kube.rest import NODES, ApiError, Rest
from fabricdra.kubeletplugin.kubelet import ClaimSweeper, PluginPaths, PluginServer
from fabricdra.kubeletplugin.kubelet.checkpoint import BOOT_ID_PATH, current_boot_id

from .daemon import REPORT_LEASE_SECONDS
from .driver import ComputeDomainDriver, NodeConfig
from .report import write_host_report

log = structlog.get_logger("fabricdra.compute-domain-plugin")


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    cdi_dir: Path = Path("/var/run/cdi")
    plugin_dir: Path = Path("/var/lib/kubelet/plugins") / cd.DRIVER
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    pod_uid: str | None = None  # per-pod socket names (rolling updates), see PluginPaths
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/dev")
    imex_ctl: str = "nvidia-imex-ctl"
    host_imex_socket: Path | None = None  # host mode: the host IMEX command socket (hostimex.py)
    imex_wait_seconds: float = 20.0  # prepare's bound on waiting for a READY IMEX
    driver_root: Path = Path("/")  # host path of the NVIDIA driver install
    driver_root_view: Path | None = None  # where this plugin sees driver_root (None: same)
    report_namespace: str = "fabricdra-system"
    # Host IMEX mode: seconds between checks of the host's IMEX service (the chart passes 30
    # with computeDomains.hostImex.enabled); 0: host mode off, no report at all.
    host_imex_interval: float = 0.0
    sweep_interval: float = 600.0  # seconds between reports of claims gone from the API
    boot_id_file: Path = BOOT_ID_PATH  # the kernel's boot id: state of another boot is dropped


class ComputeDomainPlugin:
    def __init__(self, config: PluginConfig, api: Any) -> None:
        self.config = config
        self.rest = Rest(api)
        node = self.rest.get(NODES, config.node_name)
        self.node_labels: dict[str, str] = node["metadata"].get("labels", {}) or {}
        self.driver = ComputeDomainDriver(
            self.rest,
            NodeConfig(
                node_name=config.node_name,
                cdi_dir=config.cdi_dir,
                plugin_dir=config.plugin_dir,
                proc_root=config.proc_root,
                dev_root=config.dev_root,
                fabric_domain=self.node_labels.get(labels.FABRIC_DOMAIN, ""),
                fabric_from_node=True,  # followed, not read once (see fabric_domain())
                imex_ctl=config.imex_ctl,
                host_imex_socket=config.host_imex_socket,
                imex_wait_seconds=config.imex_wait_seconds,
                driver_root=config.driver_root,
                driver_root_view=config.driver_root_view,
                boot_id=current_boot_id(config.boot_id_file),
                # The release's namespace: the controller's, where it makes daemon claims.
                daemon_namespace=config.report_namespace,
            ),
        )
        self.sweeper = ClaimSweeper(
            self.driver.checkpoint, self.driver.claims, config.sweep_interval, cd.DRIVER
        )
        self.server = PluginServer(
            self.driver,
            PluginPaths.for_driver(
                cd.DRIVER,
                registry_dir=config.registry_dir,
                plugin_dir=config.plugin_dir,
                instance=config.pod_uid,
            ),
        )

    def run(self, stop: threading.Event) -> None:
        """Serve kubelet until `stop` is set (raises `PluginServerError` if the sockets
        cannot be opened)."""
        self.server.start()
        self.sweeper.start()
        try:
            if self.node_labels.get(cd.PLUGIN_NODE_LABEL) != "true":
                self.rest.patch(
                    NODES,
                    self.config.node_name,
                    {"metadata": {"labels": {cd.PLUGIN_NODE_LABEL: "true"}}},
                )
            if self.config.host_imex_interval > 0:
                self._report_host_imex(stop)
            else:
                stop.wait()
        finally:
            self.sweeper.stop()
            self.server.stop()

    def _report_host_imex(self, stop: threading.Event) -> None:
        """Ask the host's IMEX service every interval and say what it answered in the host
        report Lease, so a host-mode domain on a broken service shows Degraded instead of
        Ready. The Lease is also this node's heartbeat: its renewTime is rewritten every third
        of its duration (at least 3 intervals, at least the managed daemons' 40 s), so a node
        that lost power turns its rows not ready, as a silent managed daemon does. Only host
        mode runs this (`host_imex_interval` > 0: the chart's `computeDomains.hostImex`), and
        a pass writes only when the answer changed or the heartbeat is due, without reading
        the Lease first: a pass where nothing changed costs no API request (at 5,000 nodes a
        GET and a PATCH per node every 30 s were ~167 of each a second)."""
        interval = self.config.host_imex_interval
        lease_seconds = max(REPORT_LEASE_SECONDS, math.ceil(3 * interval))
        renewed_at: float | None = None
        said: tuple[bool, str] | None = None  # what the Lease says (as this process wrote it)
        while True:
            answer = self.driver.host_imex()
            due = renewed_at is None or time.monotonic() - renewed_at >= lease_seconds / 3
            if answer != said or due:
                try:
                    write_host_report(
                        self.rest,
                        self.config.report_namespace,
                        self.config.node_name,
                        ready=answer[0],
                        message=answer[1],
                        lease_seconds=lease_seconds,
                        renew=True,
                    )
                    renewed_at, said = time.monotonic(), answer
                except ApiError as e:  # transient: the next interval tries again
                    log.error("host IMEX report not written", error=str(e))
            if stop.wait(interval):
                return
