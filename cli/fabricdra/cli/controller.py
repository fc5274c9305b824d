"""`fabricdra controller`: the ComputeDomain controller.

Every flag has an environment variable (`FABRICDRA_<FLAG>`); the flag wins. All of them are
listed in docs/compute-domains.md.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from fabricdra.cli.common import UsageError, api_client, env_choice, env_float, env_int, stop_event
from fabricdra.cli.common import env as _env
from fabricdra.controller.objects import (
    DEFAULT_DAEMON_CPU,
    DEFAULT_DAEMON_MEMORY,
    DEFAULT_DAEMON_MEMORY_LIMIT,
    DEFAULT_IMAGE,
)

# A Kubernetes resource quantity (apimachinery's resource.Quantity): a number, then an SI,
# binary or decimal-exponent suffix.
# kube-scheduler's DynamicResourcesArgs.bindingTimeout default: how long it waits for a pod's
# binding conditions (https://kubernetes.io/docs/reference/config-api/kube-scheduler-config.v1/).
SCHEDULER_BINDING_TIMEOUT = 600
QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[nukmMGTPE]|[KMGTPE]i)?$")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "controller",
        help="run the ComputeDomain controller",
        description="Watch ComputeDomains; create their claim templates and IMEX DaemonSets, "
        "allocate IMEX channels, hold each node for one domain, and write their status. Each "
        "flag can also be set by the environment variable in brackets.",
    )
    a = p.add_argument
    a(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file; default: the in-cluster service account [FABRICDRA_KUBECONFIG]",
    )
    a(
        "--namespace",
        default=_env("NAMESPACE", "fabricdra-system"),
        help="the driver's namespace: IMEX DaemonSets, daemon reports, the leader lease "
        "(default fabricdra-system) [FABRICDRA_NAMESPACE]",
    )
    a(
        "--image",
        default=_env("IMAGE", DEFAULT_IMAGE),
        help="image of the IMEX daemon pods [FABRICDRA_IMAGE]",
    )
    a(
        "--image-pull-policy",
        default=env_choice(
            "IMAGE_PULL_POLICY", "IfNotPresent", ("Always", "IfNotPresent", "Never")
        ),
        choices=("Always", "IfNotPresent", "Never"),
        help="pull policy of the IMEX daemon pods (default IfNotPresent) "
        "[FABRICDRA_IMAGE_PULL_POLICY]",
    )
    a(
        "--imex-daemon-cpu",
        default=_env("IMEX_DAEMON_CPU", DEFAULT_DAEMON_CPU),
        help="CPU request of each IMEX daemon container (no CPU limit), a Kubernetes quantity "
        f"(default {DEFAULT_DAEMON_CPU}) [FABRICDRA_IMEX_DAEMON_CPU]",
    )
    a(
        "--imex-daemon-memory",
        default=_env("IMEX_DAEMON_MEMORY", DEFAULT_DAEMON_MEMORY),
        help="memory request of each IMEX daemon container, a Kubernetes quantity "
        f"(default {DEFAULT_DAEMON_MEMORY}) [FABRICDRA_IMEX_DAEMON_MEMORY]",
    )
    a(
        "--imex-daemon-memory-limit",
        default=_env("IMEX_DAEMON_MEMORY_LIMIT", DEFAULT_DAEMON_MEMORY_LIMIT),
        help="memory limit of each IMEX daemon container, a Kubernetes quantity, at least "
        f"--imex-daemon-memory (default {DEFAULT_DAEMON_MEMORY_LIMIT}) "
        "[FABRICDRA_IMEX_DAEMON_MEMORY_LIMIT]",
    )
    a(
        "--daemon-env",
        default=_env("DAEMON_ENV", "[]"),
        help="extra environment of the IMEX daemon containers, a JSON list of Kubernetes EnvVar "
        'objects, e.g. \'[{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}]\' (the '
        "chart passes its extraEnv) [FABRICDRA_DAEMON_ENV]",
    )
    a(
        "--workers",
        type=int,
        default=env_int("WORKERS", 4),
        help="parallel domain reconcilers (default 4) [FABRICDRA_WORKERS]",
    )
    a(
        "--resync-seconds",
        type=float,
        default=env_float("RESYNC_SECONDS", 300),
        help="how often every object is re-checked even without events (default 300) "
        "[FABRICDRA_RESYNC_SECONDS]",
    )
    a(
        "--leader-elect",
        default=env_choice("LEADER_ELECT", "true", ["true", "false"]),
        choices=["true", "false"],
        help="take a Lease before working, so replicas are safe (default true) "
        "[FABRICDRA_LEADER_ELECT]",
    )
    a(
        "--identity",
        default=_env("IDENTITY"),
        help="this replica's name in the leader Lease (default hostname-pid) [FABRICDRA_IDENTITY]",
    )
    a(
        "--lease-seconds",
        type=float,
        default=env_float("LEASE_SECONDS", 15),
        help="leader Lease duration; a leader that cannot renew for 2/3 of it stops (default "
        "15) [FABRICDRA_LEASE_SECONDS]",
    )
    a(
        "--imex-channel-count",
        type=int,
        default=env_int("IMEX_CHANNEL_COUNT", 2048),
        help="IMEX channels the nodes' nvidia driver offers (its NVreg_ImexChannelCount; "
        "default 2048) [FABRICDRA_IMEX_CHANNEL_COUNT]",
    )
    a(
        "--gang-timeout-seconds",
        type=float,
        default=env_float("GANG_TIMEOUT_SECONDS", 300),
        help="a domain with numNodes: how long its claims wait at binding for the whole gang "
        "before they are released; below 600, kube-scheduler's binding timeout (default 300) "
        "[FABRICDRA_GANG_TIMEOUT_SECONDS]",
    )
    a(
        "--require-verified-nodes",
        default=env_choice("REQUIRE_VERIFIED_NODES", "false", ["true", "false"]),
        choices=["true", "false"],
        help="gang placement counts only nodes labelled fabricdra.io/verified=true (set where "
        "the devices plugin's verification gate is on; default false) "
        "[FABRICDRA_REQUIRE_VERIFIED_NODES]",
    )
    a(
        "--fabric-check",
        default=env_choice("FABRIC_CHECK", "false", ["true", "false"]),
        choices=["true", "false"],
        help="run the multi-node NVLink check in each fabric domain and count a node of one "
        "for gangs only once it passed there (label fabricdra.io/fabric-verified=true; "
        "default false) [FABRICDRA_FABRIC_CHECK]",
    )
    a(
        "--fabric-check-loss",
        default=env_choice("FABRIC_CHECK_LOSS", "false", ["true", "false"]),
        choices=["true", "false"],
        help="after a fabric domain's check passed, run nccl-tests all_reduce_perf on two of "
        "its trays and split across two NVLink domains, and show the step times and their "
        "ratio in spanning ComputeDomains' status.measuredLoss (the image must hold "
        "all_reduce_perf_mpi, nccl-tests built with MPI=1; default false) "
        "[FABRICDRA_FABRIC_CHECK_LOSS]",
    )
    a(
        "--fabric-check-image",
        default=_env("FABRIC_CHECK_IMAGE") or "",
        help="the verification image the fabric check's pods run: nvbandwidth-multinode "
        "(nvbandwidth built with -DMULTINODE=1), Open MPI's mpirun, OpenSSH's sshd; empty: the "
        "check is NotRun "
        "[FABRICDRA_FABRIC_CHECK_IMAGE]",
    )
    a(
        "--fabric-check-timeout-seconds",
        type=float,
        default=env_float("FABRIC_CHECK_TIMEOUT_SECONDS", 600),
        help="how long one fabric check's MPI run may take once its pods are up (default 600) "
        "[FABRICDRA_FABRIC_CHECK_TIMEOUT_SECONDS]",
    )
    a(
        "--fabric-check-concurrency",
        type=int,
        default=env_int("FABRIC_CHECK_CONCURRENCY", 16),
        help="how many fabric domains (racks) are checked at once (default 16) "
        "[FABRICDRA_FABRIC_CHECK_CONCURRENCY]",
    )
    a(
        "--workload-api",
        default=env_choice("WORKLOAD_API", "auto", ["auto", "true", "false"]),
        choices=["auto", "true", "false"],
        help="read the Kubernetes Workload API (scheduling.k8s.io/v1alpha2 PodGroups): a "
        "domain without numNodes whose pods belong to a gang PodGroup takes its gang size and "
        "topology constraint from it; auto: where the API server serves PodGroups (default "
        "auto) [FABRICDRA_WORKLOAD_API]",
    )
    a(
        "--fabric-check-imex-mode",
        default=env_choice("FABRIC_CHECK_IMEX_MODE", "managed", ["managed", "host"]),
        choices=["managed", "host"],
        help="imexMode of the fabric check's own ComputeDomain (default managed) "
        "[FABRICDRA_FABRIC_CHECK_IMEX_MODE]",
    )
    a(
        "--fabric-check-runtime-class",
        default=_env("FABRIC_CHECK_RUNTIME_CLASS") or "",
        help="runtimeClassName of the fabric check's worker pods, e.g. nvidia (default none) "
        "[FABRICDRA_FABRIC_CHECK_RUNTIME_CLASS]",
    )
    a(
        "--scale-out-tiers",
        default=env_choice("SCALE_OUT_TIERS", "false", ["true", "false"]),
        choices=["true", "false"],
        help="write the scale-out tier labels fabricdra.io/network.tier-1/-2/-3 on Nodes from "
        "the NodeDevices records, the ibnetdiscover ConfigMaps (label fabricdra.io/ibnetdiscover) "
        "and --topology-file, and run the cabling check (docs/scale-out.md; default false) "
        "[FABRICDRA_SCALE_OUT_TIERS]",
    )
    a(
        "--topology-file",
        default=_env("TOPOLOGY_FILE") or "",
        help="the operator's topology file (Slurm topology.conf tree form or the per-node/per-NIC "
        "YAML, docs/scale-out.md); read with --scale-out-tiers, again every minute "
        "[FABRICDRA_TOPOLOGY_FILE]",
    )
    a(
        "--metrics-port",
        type=int,
        default=env_int("METRICS_PORT", 8080, empty=0),
        help="Prometheus /metrics port, 0 to disable (default 8080) [FABRICDRA_METRICS_PORT]",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from fabricdra.controller import metrics
    from fabricdra.controller.fabriccheckrun import RunSettings
    from fabricdra.controller.manager import Controller, ControllerConfig
    from fabricdra.controller.objects import DaemonSettings

    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds must be positive, got {args.resync_seconds}")
    if not 0 < args.gang_timeout_seconds < SCHEDULER_BINDING_TIMEOUT:
        # At or past the scheduler's own binding wait, the scheduler gives up the gang's pods
        # one by one before the controller releases the gang as a whole (nodes.py).
        raise UsageError(
            "--gang-timeout-seconds must be more than 0 and less than "
            f"{SCHEDULER_BINDING_TIMEOUT} (kube-scheduler's binding timeout), "
            f"got {args.gang_timeout_seconds:g}"
        )
    if args.lease_seconds < 3:
        raise UsageError(f"--lease-seconds must be at least 3, got {args.lease_seconds}")
    if not 1 <= args.imex_channel_count <= 2048:
        raise UsageError(
            f"--imex-channel-count must be between 1 and 2048, got {args.imex_channel_count}"
        )
    for flag, value in (
        ("--imex-daemon-cpu", args.imex_daemon_cpu),
        ("--imex-daemon-memory", args.imex_daemon_memory),
        ("--imex-daemon-memory-limit", args.imex_daemon_memory_limit),
    ):
        if not QUANTITY.match(value or ""):
            raise UsageError(
                f"{flag} must be a Kubernetes quantity such as 100m or 128Mi, got {value!r}"
            )
    from kubernetes.utils.quantity import parse_quantity

    quantity: Any = parse_quantity  # the client's function is untyped
    if quantity(args.imex_daemon_memory_limit) < quantity(args.imex_daemon_memory):
        # The API server would refuse every IMEX DaemonSet: say so now.
        raise UsageError(
            f"--imex-daemon-memory-limit ({args.imex_daemon_memory_limit}) must be at least "
            f"--imex-daemon-memory ({args.imex_daemon_memory})"
        )
    if args.fabric_check_timeout_seconds <= 0:
        raise UsageError(
            "--fabric-check-timeout-seconds must be positive, "
            f"got {args.fabric_check_timeout_seconds:g}"
        )
    if args.fabric_check_concurrency < 1:
        raise UsageError(
            f"--fabric-check-concurrency must be at least 1, got {args.fabric_check_concurrency}"
        )
    daemon_env = _daemon_env(args.daemon_env)
    api = api_client(args.kubeconfig)
    if not _preflight(api):
        return 1
    workload_api = _workload_api(api, args.workload_api)
    if workload_api is None:
        return 1
    cfg = ControllerConfig(
        workload_api=workload_api,
        namespace=args.namespace,
        daemon=DaemonSettings(
            namespace=args.namespace,
            image=args.image,
            image_pull_policy=args.image_pull_policy,
            cpu=args.imex_daemon_cpu,
            memory=args.imex_daemon_memory,
            memory_limit=args.imex_daemon_memory_limit,
            extra_env=daemon_env,
        ),
        domain_workers=args.workers,
        resync_seconds=args.resync_seconds,
        leader_election=args.leader_elect == "true",
        lease_seconds=args.lease_seconds,
        channel_count=args.imex_channel_count,
        gang_timeout_seconds=args.gang_timeout_seconds,
        require_verified_nodes=args.require_verified_nodes == "true",
        fabric_check=args.fabric_check == "true",
        fabric_run=RunSettings(
            image=args.fabric_check_image,
            timeout_seconds=args.fabric_check_timeout_seconds,
            imex_mode=args.fabric_check_imex_mode,
            runtime_class=args.fabric_check_runtime_class,
        ),
        fabric_check_concurrency=args.fabric_check_concurrency,
        fabric_check_loss=args.fabric_check_loss == "true",
        scale_out_tiers=args.scale_out_tiers == "true",
        topology_file=args.topology_file,
        **({"identity": args.identity} if args.identity else {}),
    )
    controller = Controller(api, cfg)
    if args.metrics_port:
        from fabricdra.controller import fleetmetrics

        # The fleet view (docs/fleet.md), counting nodes as gang placement does, served from
        # the controller's caches (no LIST per scrape).
        fleetmetrics.register(
            controller,
            metrics.REGISTRY,
            require_verified_nodes=cfg.require_verified_nodes,
            require_fabric_verified=cfg.fabric_check,
        )
        start_http_server(args.metrics_port, registry=metrics.REGISTRY)
    stop = stop_event()
    controller.start()
    while not stop.wait(0.5):
        if controller.elector is not None and controller.elector.lost.is_set():
            controller.stop()
            return 1
    controller.stop()
    return 0


def _preflight(api: Any) -> bool:
    """The API features ComputeDomains need (controller/preflight.py): one log line either
    way; False (the controller exits 1) when any is off or the server cannot be asked."""
    import logging

    from fabricdra.controller import preflight
    from fabricdra.kube.rest import ApiError, Rest

    log = logging.getLogger("fabricdra.controller")
    try:
        checked = preflight.check(Rest(api))
    except ApiError as e:
        log.error("cannot check the API features ComputeDomains need: %s", e)
        return False
    if not checked.ok:
        log.error("%s", checked.message())
        return False
    log.info("%s", checked.message())
    return True


def _workload_api(api: Any, wanted: str) -> bool | None:
    """--workload-api resolved against the API server: whether the controller reads PodGroups;
    None (the controller exits 1) when it cannot tell, or `true` where they are not served."""
    import logging

    from fabricdra.controller import workloads
    from fabricdra.kube.rest import ApiError, Rest

    if wanted == "false":
        return False
    log = logging.getLogger("fabricdra.controller")
    try:
        served = workloads.served(Rest(api).call)
    except ApiError as e:
        log.error("cannot tell whether the API server serves the Workload API: %s", e)
        return None
    if wanted == "true" and not served:
        log.error(
            "--workload-api true, but the API server does not serve %s/%s PodGroups (feature "
            "gate GenericWorkload and --runtime-config=%s/%s=true on kube-apiserver)",
            workloads.PODGROUPS.group,
            workloads.PODGROUPS.version,
            workloads.PODGROUPS.group,
            workloads.PODGROUPS.version,
        )
        return None
    log.info("Workload API (PodGroups): %s", "read" if served else "not served; not read")
    return served


def _daemon_env(text: str) -> tuple[dict[str, Any], ...]:
    """--daemon-env: a JSON list of EnvVar objects, each with a name."""
    import json

    try:
        env = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--daemon-env is not JSON: {e}") from None
    if not isinstance(env, list) or not all(
        isinstance(v, dict) and isinstance(v.get("name"), str) and v["name"] for v in env
    ):
        raise UsageError(
            f"--daemon-env must be a JSON list of objects with a name (EnvVar), got {text!r}"
        )
    return tuple(env)
