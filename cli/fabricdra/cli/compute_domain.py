"""The compute-domain node side: `fabricdra compute-domain-plugin` and `fabricdra imex-daemon`.

Every flag has an environment variable (`FABRICDRA_<FLAG>`); the flag wins. All of them are
listed in docs/compute-domains.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from fabricdra.cli.common import (
    UsageError,
    add_node_plugin_flags,
    api_client,
    env_float,
    env_int,
    stop_event,
)
from fabricdra.cli.common import env as _env


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "compute-domain-plugin",
        help="run the compute-domain.fabricdra.io kubelet DRA plugin on this node",
        description="Serve kubelet's DRA API for compute-domain.fabricdra.io: inject a "
        "ComputeDomain's IMEX channel into its workloads. Labels the node so the controller "
        "publishes its devices. Each flag can also be set by the environment variable in "
        "brackets.",
    )
    a = p.add_argument
    add_node_plugin_flags(
        p,
        plugin_dir="/var/lib/kubelet/plugins/compute-domain.fabricdra.io",
        plugin_dir_help="socket, checkpoint and per-domain folders",
    )
    a(
        "--imex-ctl",
        default=_env("IMEX_CTL", "nvidia-imex-ctl"),
        help="host IMEX mode: the host service's control tool; a bare name is looked for "
        "in the driver root (usr/bin, usr/sbin, bin), then on PATH [FABRICDRA_IMEX_CTL]",
    )
    a(
        "--host-imex-socket",
        default=_env("HOST_IMEX_SOCKET"),
        help="host IMEX mode: the host service's command socket (its IMEX_CMD_UNIX_DOMAIN_PATH), "
        "asked with `nvidia-imex-ctl -u <socket> -q`; empty: the tool's own default "
        "[FABRICDRA_HOST_IMEX_SOCKET]",
    )
    a(
        "--driver-root",
        default=_env("DRIVER_ROOT", "/"),
        help="host path of the NVIDIA driver install, whose nvidia-imex and nvidia-imex-ctl "
        "IMEX daemons get (default /; /run/nvidia/driver with the GPU operator) "
        "[FABRICDRA_DRIVER_ROOT]",
    )
    a(
        "--container-driver-root",
        default=_env("CONTAINER_DRIVER_ROOT"),
        help="where this plugin sees --driver-root (default: the same path) "
        "[FABRICDRA_CONTAINER_DRIVER_ROOT]",
    )
    a(
        "--imex-wait-seconds",
        type=float,
        default=env_float("IMEX_WAIT_SECONDS", 20),
        help="how long prepare waits for IMEX on this node to be READY before failing the "
        "claim (kubelet retries; default 20, below kubelet's 45 s) [FABRICDRA_IMEX_WAIT_SECONDS]",
    )
    a(
        "--report-namespace",
        default=_env("REPORT_NAMESPACE", "fabricdra-system"),
        help="the controller's namespace: the host IMEX report Lease's, and the only one "
        "whose IMEX daemon claims are prepared (default fabricdra-system) "
        "[FABRICDRA_REPORT_NAMESPACE]",
    )
    a(
        "--host-imex-interval",
        type=float,
        default=env_float("HOST_IMEX_INTERVAL", 0, empty=0),
        help="host IMEX mode: seconds between checks of the host's IMEX service, reported "
        "(when the answer changes, and as a heartbeat) for host-mode domains; the chart "
        "passes 30 with computeDomains.hostImex.enabled; 0 (default): host mode off, no "
        "report [FABRICDRA_HOST_IMEX_INTERVAL]",
    )
    p.set_defaults(run=run_plugin)

    d: argparse.ArgumentParser = sub.add_parser(
        "imex-daemon",
        help="run IMEX for one ComputeDomain on this node (started by the controller)",
        description="Write the IMEX config from the ComputeDomain's peers, run nvidia-imex, "
        "report its readiness. --check answers a readiness probe instead.",
    )
    b = d.add_argument
    b("--check", action="store_true", help="exit 0 if the local IMEX daemon is READY, else 1")
    b("--kubeconfig", default=_env("KUBECONFIG"), help="[FABRICDRA_KUBECONFIG]")
    b("--node-name", default=os.environ.get("NODE_NAME"), help="[NODE_NAME]")
    b("--pod-ip", default=os.environ.get("POD_IP", ""), help="[POD_IP]")
    b("--domain-name", default=_env("DOMAIN_NAME"), help="[FABRICDRA_DOMAIN_NAME]")
    b("--domain-namespace", default=_env("DOMAIN_NAMESPACE"), help="[FABRICDRA_DOMAIN_NAMESPACE]")
    b("--domain-uid", default=_env("DOMAIN_UID"), help="[FABRICDRA_DOMAIN_UID]")
    b(
        "--report-namespace",
        default=_env("REPORT_NAMESPACE", "fabricdra-system"),
        help="where the report Lease goes [FABRICDRA_REPORT_NAMESPACE]",
    )
    b(
        "--config-dir",
        default=_env("IMEX_CONFIG_DIR", "/imexd"),
        help="IMEX config folder (default /imexd) [FABRICDRA_IMEX_CONFIG_DIR]",
    )
    b("--imex-bin", default=_env("IMEX_BIN", "nvidia-imex"), help="[FABRICDRA_IMEX_BIN]")
    b("--imex-ctl", default=_env("IMEX_CTL", "nvidia-imex-ctl"), help="[FABRICDRA_IMEX_CTL]")
    b(
        "--interval",
        type=float,
        default=env_float("IMEX_INTERVAL", 2),
        help="seconds between IMEX health passes; domain changes are watched, not polled "
        "(default 2) [FABRICDRA_IMEX_INTERVAL]",
    )
    b(
        "--hosts-file",
        default=_env("IMEX_HOSTS_FILE", "/etc/hosts"),
        help="hosts file that resolves the IMEX peer names (default /etc/hosts) "
        "[FABRICDRA_IMEX_HOSTS_FILE]",
    )
    b(
        "--max-peers",
        type=int,
        default=env_int("IMEX_MAX_PEERS", 18),
        help="peer name slots in IMEX's nodes config (default 18: an NVL72 rack) "
        "[FABRICDRA_IMEX_MAX_PEERS]",
    )
    b(
        "--driver-version",
        default=_env("DRIVER_VERSION", ""),
        help="the loaded NVIDIA driver's version (set by the node plugin at prepare); IMEX is "
        "not started below 570.158.01 (default: not checked) [FABRICDRA_DRIVER_VERSION]",
    )
    b(
        "--imex-library-path",
        default=_env("IMEX_LIBRARY_PATH", ""),
        help="LD_LIBRARY_PATH for nvidia-imex and nvidia-imex-ctl: where the node plugin "
        "mounted the driver's libraries (set at prepare) [FABRICDRA_IMEX_LIBRARY_PATH]",
    )
    d.set_defaults(run=run_daemon)


def run_plugin(args: argparse.Namespace) -> int:
    from fabricdra.kubeletplugin.computedomain.plugin import ComputeDomainPlugin, PluginConfig
    from fabricdra.kubeletplugin.kubelet.server import PluginServerError

    if not args.node_name:
        raise UsageError("--node-name (or FABRICDRA_NODE_NAME) is required")
    if not 0 <= args.imex_wait_seconds <= 40:
        raise UsageError(
            f"--imex-wait-seconds must be between 0 and 40 (kubelet's deadline is 45 s), "
            f"got {args.imex_wait_seconds}"
        )
    config = PluginConfig(
        node_name=args.node_name,
        cdi_dir=Path(args.cdi_dir),
        plugin_dir=Path(args.plugin_dir),
        registry_dir=Path(args.registry_dir),
        pod_uid=args.pod_uid or None,
        proc_root=Path(args.proc_root),
        dev_root=Path(args.dev_root),
        imex_ctl=args.imex_ctl,
        host_imex_socket=Path(args.host_imex_socket) if args.host_imex_socket else None,
        imex_wait_seconds=args.imex_wait_seconds,
        driver_root=Path(args.driver_root),
        driver_root_view=Path(args.container_driver_root) if args.container_driver_root else None,
        report_namespace=args.report_namespace,
        host_imex_interval=args.host_imex_interval,
    )
    api = api_client(args.kubeconfig, "fabricdra-compute-domain-plugin/0.2.0")
    try:
        plugin = ComputeDomainPlugin(config, api)
        plugin.run(stop_event())
    except PluginServerError as e:
        raise UsageError(str(e)) from None
    return 0


def run_daemon(args: argparse.Namespace) -> int:
    from fabricdra.kube.rest import Rest
    from fabricdra.kubeletplugin.computedomain.daemon import DaemonIdentity, ImexDaemon
    from fabricdra.kubeletplugin.computedomain.imex import ImexSettings, ImexSupervisor

    settings = ImexSettings(
        config_dir=Path(args.config_dir),
        imex_bin=args.imex_bin,
        imex_ctl=args.imex_ctl,
        bind_ip=args.pod_ip,
        hosts_file=Path(args.hosts_file),
        max_peers=args.max_peers,
        driver_version=args.driver_version or "",
        library_path=args.imex_library_path or "",
    )
    supervisor = ImexSupervisor(settings)
    if args.check:
        state = supervisor.query()
        print(state.message)
        return 0 if state.ready else 1
    if args.max_peers < 1:
        raise UsageError(f"--max-peers must be at least 1, got {args.max_peers}")
    missing = [
        f
        for f in ("node_name", "domain_name", "domain_namespace", "domain_uid")
        if not getattr(args, f)
    ]
    if missing:
        raise UsageError("missing " + ", ".join("--" + m.replace("_", "-") for m in missing))
    who = DaemonIdentity(
        args.node_name,
        args.pod_ip,
        args.domain_namespace,
        args.domain_name,
        args.domain_uid,
        args.report_namespace,
    )
    daemon = ImexDaemon(Rest(api_client(args.kubeconfig)), who, supervisor)
    daemon.run(stop_event(), args.interval)
    return 0
