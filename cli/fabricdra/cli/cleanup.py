"""`fabricdra cleanup`: remove everything fabricdra's components made in the cluster (the chart's
pre-delete hook; controller/fabricdra/controller/cleanup.py says what and in which order).

Every flag has an environment variable (`FABRICDRA_<FLAG>`); the flag wins. Documented in
docs/install.md ("Uninstall") and docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fabricdra.cli.common import (
    UsageError,
    api_client,
    env_choice,
    env_float,
    env_int,
    print_json,
)
from fabricdra.cli.common import env as _env

SCOPES = ("all", "compute-domains")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "cleanup",
        help="remove what fabricdra made in the cluster (run by `helm uninstall`)",
        description="Stop the release's controller Deployment, release every ComputeDomain "
        "(users' domains are kept: the claim templates and IMEX DaemonSet made for each are "
        "deleted and its finalizer dropped; the controller's own fabric-check domains are "
        "deleted), stop the node DaemonSet, then delete the ResourceSlices of both drivers, "
        "the NodeDevices, the fabricdra.io/ and compute-domain.fabricdra.io/ node labels, "
        "leftover claim templates and IMEX DaemonSets, Leases and DeviceClasses. Lists are "
        "read in pages. Prints what it removed as JSON. Each flag can also be set by the "
        "environment variable in brackets.",
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
        help="the release's namespace (components, IMEX DaemonSets, Leases; default "
        "fabricdra-system) [FABRICDRA_NAMESPACE]",
    )
    a(
        "--release",
        default=_env("RELEASE", "fabricdra"),
        help="the Helm release whose node DaemonSet and controller Deployment are stopped "
        "(default fabricdra) [FABRICDRA_RELEASE]",
    )
    a(
        "--domain-timeout",
        type=float,
        default=env_float("DOMAIN_TIMEOUT", 60),
        help="seconds the IMEX daemon pods of the released ComputeDomains get to terminate "
        "(their claims unprepared by the node plugin, still running) before the node "
        "DaemonSet is stopped (default 60) [FABRICDRA_DOMAIN_TIMEOUT]",
    )
    a(
        "--stop-timeout",
        type=float,
        default=env_float("STOP_TIMEOUT", 120),
        help="seconds the components' pods get to terminate (default 120) [FABRICDRA_STOP_TIMEOUT]",
    )
    a(
        "--scope",
        choices=SCOPES,
        default=env_choice("SCOPE", "all", SCOPES),
        help="all (uninstall, default) or compute-domains: what an upgrade turning "
        "computeDomains.enabled off leaves behind (the chart's pre-upgrade hook): stop the "
        "controller, release every ComputeDomain, remove the compute-domain slices, the "
        "controller's node labels, Leases and DeviceClasses; the node pods keep running "
        "[FABRICDRA_SCOPE]",
    )
    a(
        "--page-size",
        type=int,
        default=env_int("PAGE_SIZE", 500),
        help="objects per LIST page (default 500) [FABRICDRA_PAGE_SIZE]",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fabricdra.controller.cleanup import Cleanup, CleanupConfig, CleanupError
    from fabricdra.kube.rest import ApiError, Rest

    for flag in ("domain_timeout", "stop_timeout"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must not be negative")
    if args.page_size < 1:
        raise UsageError("--page-size must be at least 1")
    if not args.release:
        raise UsageError("--release must name the Helm release")
    cleanup = Cleanup(
        Rest(api_client(args.kubeconfig, "fabricdra-cleanup")),
        CleanupConfig(
            namespace=args.namespace,
            release=args.release,
            domain_timeout=args.domain_timeout,
            stop_timeout=args.stop_timeout,
            page_size=args.page_size,
        ),
    )
    try:
        report = cleanup.run_compute_domains() if args.scope == "compute-domains" else cleanup.run()
    except (CleanupError, ApiError) as e:
        print_json(cleanup.report.as_json())
        print(f"fabricdra cleanup: {e}", file=sys.stderr)
        return 1
    print_json(report.as_json())
    return 0
