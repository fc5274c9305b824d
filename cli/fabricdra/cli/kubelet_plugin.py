"""`fabricdra kubelet-plugin`: the devices.fabricdra.io node agent (kubelet DRA plugin).

Every flag has an environment variable (`FABRICDRA_<FLAG>`, e.g. FABRICDRA_NODE_NAME); the
flag wins. All of them are listed in docs/kubelet-plugin.md.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

import structlog

from fabricdra.cli import logs
from fabricdra.cli.common import (
    UsageError,
    add_node_plugin_flags,
    api_client,
    env_bool,
    env_choice,
    env_float,
    env_int,
)
from fabricdra.cli.common import env as _env
from fabricdra.cli.deviceflags import add_device_flags, device_config

log = structlog.get_logger("fabricdra.kubelet-plugin")

USER_AGENT = "fabricdra-kubelet-plugin/0.2.0"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "kubelet-plugin",
        help="run the devices.fabricdra.io kubelet DRA plugin on this node",
        description="Discover this node's GPUs and RDMA NICs, publish them as ResourceSlices, "
        "a NodeDevices record and node labels, and prepare claims for kubelet over its DRA "
        "gRPC API. Each flag can also be set by the environment variable in brackets.",
    )
    a = p.add_argument
    add_node_plugin_flags(
        p,
        plugin_dir="/var/lib/kubelet/plugins/devices.fabricdra.io",
        plugin_dir_help="folder of the DRA socket dra.sock",
    )
    a("--sysfs-root", default=_env("SYSFS_ROOT", "/sys"), help="sysfs root [FABRICDRA_SYSFS_ROOT]")
    a(
        "--nvml-snapshot",
        default=_env("NVML_SNAPSHOT"),
        metavar="FILE",
        help="recorded NVML answers instead of the library [FABRICDRA_NVML_SNAPSHOT]",
    )
    a(
        "--toolkit-cdi-dirs",
        default=_env("TOOLKIT_CDI_DIRS", "/etc/cdi,/var/run/cdi"),
        help="comma-separated folders searched for the NVIDIA container toolkit's CDI spec "
        "[FABRICDRA_TOOLKIT_CDI_DIRS]",
    )
    a(
        "--state-dir",
        default=_env("STATE_DIR"),
        help="folder of checkpoint.json; default: the plugin dir [FABRICDRA_STATE_DIR]",
    )
    add_device_flags(p)
    a(
        "--device-plugin-resource",
        action="append",
        metavar="GROUP=RESOURCE",
        default=[r for r in (_env("DEVICE_PLUGIN_RESOURCES", "") or "").split(",") if r],
        help="a device plugin resource name (a trailing * matches any name with that start) "
        "whose count above 0 in the Node's capacity withholds GROUP (nvidia-gpu, amd-gpu, "
        "rdma, efa, gaudi) on that node, besides the built-in names (nvidia.com/gpu, amd.com/gpu, "
        "rdma/*, ...), e.g. rdma=nvidia.com/sriov_rdma_vf; repeatable "
        "[FABRICDRA_DEVICE_PLUGIN_RESOURCES, comma-separated]",
    )
    a(
        "--lldp",
        default=env_choice("LLDP", "raw", ["raw", "lldpd", "off"]),
        choices=["raw", "lldpd", "off"],
        help="where a RoCE NIC's LLDP neighbour is read: raw (default: LLDPDUs from a raw socket "
        "on the netdev; needs CAP_NET_RAW and the host network), lldpd (the host's lldpd, via "
        "lldpcli), off [FABRICDRA_LLDP]",
    )
    a(
        "--ib-neighbours",
        default=env_choice("IB_NEIGHBOURS", "smpquery", ["smpquery", "off"]),
        choices=["smpquery", "off"],
        help="how an InfiniBand port's neighbour switch is read: smpquery (default: a "
        "directed-route SMP query of the peer, infiniband-diags) or off [FABRICDRA_IB_NEIGHBOURS]",
    )
    a(
        "--topology-file",
        metavar="PATH",
        default=_env("TOPOLOGY_FILE", "") or "",
        help="the operator's declared scale-out topology (Slurm topology.conf tree form, or the "
        "per-node/per-NIC YAML of docs/scale-out.md) [FABRICDRA_TOPOLOGY_FILE]",
    )
    a(
        "--net-role",
        action="append",
        metavar="MATCH=ROLE",
        default=[o for o in (_env("NET_ROLES", "") or "").split(",") if o],
        help="one NIC's netRole, beating measured and declared: MATCH a PCI address, netdev or "
        "RDMA device name, ROLE compute|storage|frontend; repeatable [FABRICDRA_NET_ROLES, "
        "comma-separated]",
    )
    a(
        "--device-metadata",
        action="store_true",
        default=env_bool("DEVICE_METADATA", False),
        help="KEP-5304: mount each claim request's device metadata (the devices and their "
        "ResourceSlice attributes, DeviceMetadata JSON) read-only into the containers under "
        "/var/run/kubernetes.io/dra-device-attributes [FABRICDRA_DEVICE_METADATA=true]",
    )
    a(
        "--nccl-topo-file",
        default=env_choice("NCCL_TOPO_FILE", "true", ["true", "false"]),
        choices=["true", "false"],
        help="write NCCL's XML topology of the pod's GPUs and NICs (with their PCIe switches, "
        "NUMA nodes and rails) for every claim with an NVIDIA GPU, mounted read-only with "
        "NCCL_TOPO_FILE pointing at it (default true) [FABRICDRA_NCCL_TOPO_FILE]",
    )
    a(
        "--claim-sweep-interval",
        type=float,
        default=env_float("CLAIM_SWEEP_INTERVAL", 600),
        help="seconds between sweeps that report checkpointed claims no longer in the API; "
        "only kubelet's unprepare frees them (default 600) [FABRICDRA_CLAIM_SWEEP_INTERVAL]",
    )
    a(
        "--resource-model",
        default=env_choice("RESOURCE_MODEL", "auto", ["auto", "current", "basic"]),
        choices=["auto", "current", "basic"],
        help="ResourceSlice model: current (1.36+: consumable capacity, device taints), basic "
        "(1.34/1.35 defaults), auto = from the API server's version [FABRICDRA_RESOURCE_MODEL]",
    )
    a(
        "--list-type-attributes",
        action="store_true",
        default=env_bool("LIST_TYPE_ATTRIBUTES", False),
        help="the cluster has DRAListTypeAttributes on (KEP-5491; alpha in 1.36): a device on "
        "several NUMA nodes (a Grace GPU: its CPU's and its memory's) publishes "
        "resource.kubernetes.io/numaNode as a list; off: the PCI function's node "
        "[FABRICDRA_LIST_TYPE_ATTRIBUTES=true]",
    )
    a(
        "--evict-on-fatal",
        action="store_true",
        default=env_bool("EVICT_ON_FATAL", False),
        help="a fatal fault (a GPU lost, uncorrectable memory errors, a reset or reboot the "
        "driver asks for) taints its device NoExecute, so running pods that use it are evicted; "
        "off: NoSchedule, as every fault [FABRICDRA_EVICT_ON_FATAL=true]",
    )
    a(
        "--discovery-interval",
        type=float,
        default=env_float("DISCOVERY_INTERVAL", 30),
        help="seconds between discovery passes (default 30) [FABRICDRA_DISCOVERY_INTERVAL]",
    )
    a(
        "--metrics-port",
        type=int,
        default=env_int("METRICS_PORT", 9478, empty=0),
        help="Prometheus metrics port, 0 to disable (default 9478) [FABRICDRA_METRICS_PORT]",
    )
    a(
        "--dcgm-exporter-url",
        default=_env("DCGM_EXPORTER_URL"),
        help="dcgm-exporter metrics URL for GPU health, e.g. http://localhost:9400/metrics; "
        "default: NVML only [FABRICDRA_DCGM_EXPORTER_URL]",
    )
    a(
        "--verification-gate",
        default=env_choice("VERIFICATION_GATE", "on", ["on", "off"]),
        choices=["on", "off"],
        help="offer devices only after a verification run passed (docs/verification.md); "
        "off trusts discovery [FABRICDRA_VERIFICATION_GATE]",
    )
    a(
        "--verify-interval",
        type=float,
        default=env_float("VERIFY_INTERVAL", 86400, empty=0),
        help="seconds between verification runs on an unchanged node (default 86400; 0: only "
        "at start-up and after a change) [FABRICDRA_VERIFY_INTERVAL]",
    )
    a(
        "--verify-tools-path",
        default=_env("VERIFY_TOOLS_PATH"),
        help="where nvbandwidth, ib_write_bw and all_reduce_perf are looked up when the agent "
        "runs the active probes itself (PATH syntax; default: $PATH) "
        "[FABRICDRA_VERIFY_TOOLS_PATH]",
    )
    a(
        "--verify-active",
        default=env_choice("VERIFY_ACTIVE", "on", ["on", "off"]),
        choices=["on", "off"],
        help="run the active probes (nvbandwidth, ib_write_bw, all_reduce_perf) on an idle node; "
        "off: Skipped and not required (docs/verification.md) [FABRICDRA_VERIFY_ACTIVE]",
    )
    a(
        "--verify-image",
        default=_env("VERIFY_IMAGE"),
        metavar="IMAGE",
        help="run the active probes in a pod from this image on the agent's node (the chart's "
        "verification.image); default: run them here, tools from --verify-tools-path "
        "[FABRICDRA_VERIFY_IMAGE]",
    )
    a(
        "--verify-namespace",
        default=_env("VERIFY_NAMESPACE") or "fabricdra-system",
        help="namespace of the verification pod (default fabricdra-system) "
        "[FABRICDRA_VERIFY_NAMESPACE]",
    )
    a(
        "--verify-runtime-class",
        default=_env("VERIFY_RUNTIME_CLASS"),
        help="runtimeClassName of the verification pod (e.g. nvidia) "
        "[FABRICDRA_VERIFY_RUNTIME_CLASS]",
    )
    a(
        "--verify-tool-timeout",
        type=float,
        default=env_float("VERIFY_TOOL_TIMEOUT", 300, empty=300),
        help="seconds one tool may run (default 300) [FABRICDRA_VERIFY_TOOL_TIMEOUT]",
    )
    a(
        "--verify-expect",
        default=_env("VERIFY_EXPECT"),
        metavar="FILE",
        help="system profile (YAML/JSON: gpus, hcas) the node is held to instead of the "
        "built-in one its DMI model names (docs/verification.md) [FABRICDRA_VERIFY_EXPECT]",
    )
    a(
        "--verify-expect-json",
        default=_env("VERIFY_EXPECT_JSON"),
        metavar="JSON",
        help="the same profile inline (the chart's verification.expect) "
        "[FABRICDRA_VERIFY_EXPECT_JSON]",
    )
    a(
        "--plugin-log-level",
        dest="plugin_log_level",
        default=env_choice("LOG_LEVEL", None, ["debug", "info", "warning", "error"]),
        choices=["debug", "info", "warning", "error"],
        help="log level (overrides the global --log-level) [FABRICDRA_LOG_LEVEL]",
    )
    p.set_defaults(run=run)


def build_config(args: argparse.Namespace) -> Any:
    from fabricdra.kubeletplugin.agent import AgentConfig
    from fabricdra.kubeletplugin.coexistence import BUILTIN_RULES, parse_rule
    from fabricdra.kubeletplugin.discovery.scaleout.annotate import parse_role_override
    from fabricdra.kubeletplugin.scaleoutsources import ScaleOutConfig
    from fabricdra.kubeletplugin.verification import Tools

    if not args.node_name:
        raise UsageError("--node-name (or FABRICDRA_NODE_NAME) is required")
    if args.discovery_interval <= 0:
        raise UsageError(f"--discovery-interval must be positive, not {args.discovery_interval}")
    if args.verify_tool_timeout <= 0:
        raise UsageError(f"--verify-tool-timeout must be positive, not {args.verify_tool_timeout}")
    if args.verify_interval < 0:
        raise UsageError(f"--verify-interval must be 0 or positive, not {args.verify_interval}")
    if args.claim_sweep_interval <= 0:
        raise UsageError(
            f"--claim-sweep-interval must be positive, not {args.claim_sweep_interval}"
        )
    devices = device_config(args)
    try:
        rules = BUILTIN_RULES + tuple(parse_rule(r) for r in args.device_plugin_resource)
    except ValueError as e:
        raise UsageError(str(e)) from None
    expect = expected_profile(args.verify_expect, args.verify_expect_json)
    try:
        roles = tuple(parse_role_override(o) for o in args.net_role)
    except ValueError as e:
        raise UsageError(str(e)) from None
    scale_out = ScaleOutConfig(
        lldp=args.lldp,
        ib=args.ib_neighbours,
        topology_file=Path(args.topology_file) if args.topology_file else None,
        roles=roles,
    )
    return AgentConfig(
        scale_out=scale_out,
        node_name=args.node_name,
        sysfs_root=Path(args.sysfs_root),
        nvml_snapshot=Path(args.nvml_snapshot) if args.nvml_snapshot else None,
        cdi_dir=Path(args.cdi_dir),
        toolkit_cdi_dirs=tuple(Path(d) for d in args.toolkit_cdi_dirs.split(",") if d),
        plugin_dir=Path(args.plugin_dir),
        registry_dir=Path(args.registry_dir),
        pod_uid=args.pod_uid or None,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        dev_root=Path(args.dev_root),
        proc_root=Path(args.proc_root),
        devices=devices,
        device_metadata=args.device_metadata,
        nccl_topo_file=args.nccl_topo_file == "true",
        list_type_attributes=args.list_type_attributes,
        evict_on_fatal=args.evict_on_fatal,
        discovery_interval=args.discovery_interval,
        sweep_interval=args.claim_sweep_interval,
        dcgm_url=args.dcgm_exporter_url or None,
        metrics_port=args.metrics_port or None,
        resource_model=args.resource_model,
        verification_gate=args.verification_gate == "on",
        verify_interval=args.verify_interval,
        verify_tools=Tools(
            path=args.verify_tools_path or None,
            timeout_seconds=args.verify_tool_timeout,
            run_bandwidth=args.verify_active == "on",
        ),
        verify_image=args.verify_image or None,
        verify_namespace=args.verify_namespace,
        verify_runtime_class=args.verify_runtime_class or None,
        verify_expect=expect,
        device_plugin_rules=rules,
    )


def expected_profile(path: str | None, inline: str | None) -> Any:
    """The operator's system profile from a file or inline text (None: neither given)."""
    from fabricdra.api.verification import parse_profile

    if path and inline:
        raise UsageError("--verify-expect and --verify-expect-json exclude each other")
    try:
        if path:
            return parse_profile(Path(path).read_text())
        if inline and inline.strip():
            return parse_profile(inline)
    except (OSError, ValueError) as e:
        raise UsageError(f"system profile: {e}") from None
    return None


def run(args: argparse.Namespace) -> int:
    from fabricdra.kubeletplugin.agent import Agent
    from fabricdra.kubeletplugin.discovery.sysfs import RootError
    from fabricdra.kubeletplugin.kubelet.checkpoint import CheckpointError
    from fabricdra.kubeletplugin.kubelet.server import PluginServerError

    if args.plugin_log_level:
        logs.configure(args.plugin_log_level)
    config = build_config(args)
    api = api_client(args.kubeconfig, USER_AGENT)
    try:
        agent = Agent(config, api)
    except (RootError, CheckpointError, PluginServerError) as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # kubeconfig missing/invalid, not in a cluster
        raise UsageError(f"cannot reach the API server: {e}") from None
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        # From a thread: the handler may run inside the main thread's own wait on these events,
        # holding the lock set() needs (common.stop_event says more).
        threading.Thread(target=agent.stop_event_wakes, args=(stop,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("starting", node=config.node_name, driver=agent.driver.driver_name)
    try:
        agent.run(stop)
    except PluginServerError as e:
        raise UsageError(str(e)) from None
    finally:
        api.close()
    return 0
