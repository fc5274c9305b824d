"""`fabricdra fleet`: the fleet view from the cluster (docs/fleet.md).

fabricdra fleet [--kubeconfig K] [-o table|json] [--watch [--interval S]]
                [--require-verified-nodes true|false] [--defrag [--limit N]]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from fabricdra.controller.fleet import DEFRAG_NOTE, STRANDED_REASONS, Defrag, Fleet, defrag
from fabricdra.controller.fleetmetrics import read_fleet_and_claims
from fabricdra.kube.rest import ApiError, Rest

from .common import UsageError, api_client, env_choice, print_json, stop_event
from .common import env as _env

USER_AGENT = "fabricdra-fleet/0.2.0"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "fleet",
        help="print devices total/healthy/verified/allocated/free per fabric domain and class",
        description="Read ResourceSlices, ResourceClaims, NodeDevices, ComputeDomains and Nodes "
        "and print, per fabric domain and device class, devices total / healthy / verified / "
        "allocated / free, the stranded GPUs and why, how many nodes an N-node ComputeDomain "
        "could still get in each domain, and each ComputeDomain's nodes.",
    )
    p.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file; default: the in-cluster service account [FABRICDRA_KUBECONFIG]",
    )
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--watch", action="store_true", help="print again every --interval seconds")
    p.add_argument(
        "--interval", type=float, default=5.0, help="seconds between --watch prints (default 5)"
    )
    p.add_argument(
        "--require-verified-nodes",
        default=env_choice("REQUIRE_VERIFIED_NODES", "false", ["true", "false"]),
        choices=["true", "false"],
        help="count a node towards LARGEST FIT only with fabricdra.io/verified=true, as gang "
        "placement does under the controller's flag of the same name (default false) "
        "[FABRICDRA_REQUIRE_VERIFIED_NODES]",
    )
    p.add_argument(
        "--fabric-check",
        default=env_choice("FABRIC_CHECK", "false", ["true", "false"]),
        choices=["true", "false"],
        help="count a node of a fabric domain towards LARGEST FIT only with "
        "fabricdra.io/fabric-verified=true, as gang placement does under the controller's "
        "flag of the same name (default false) [FABRICDRA_FABRIC_CHECK]",
    )
    p.add_argument(
        "--defrag",
        action="store_true",
        help="list, without acting, the fewest running workloads (ComputeDomains, Pods, "
        "unreserved claims holding devices) whose eviction would free a whole NVLink domain",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=5,
        help="--defrag: NVLink domains listed in the table, best first (default 5; JSON: all)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be positive, got {args.interval}")
    if args.limit <= 0:
        raise UsageError(f"--limit must be positive, got {args.limit}")
    api = api_client(args.kubeconfig, USER_AGENT)
    rest = Rest(api)
    stop = stop_event() if args.watch else None
    try:
        while True:
            try:
                view, claims = read_fleet_and_claims(
                    rest,
                    require_verified_nodes=args.require_verified_nodes == "true",
                    require_fabric_verified=args.fabric_check == "true",
                )
            except ApiError as e:
                print(f"fabricdra fleet: cannot read the cluster: {e}", file=sys.stderr)
                if stop is None:
                    return 1
            else:
                plan = defrag(view, claims) if args.defrag else None
                if args.output == "json":
                    out = view.to_json()
                    if plan is not None:
                        out["defrag"] = plan.to_json()
                    print_json(out)
                else:
                    if stop is not None:
                        print(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
                    print(render(view))
                    if plan is not None:
                        print()
                        print(render_defrag(plan, args.limit))
                sys.stdout.flush()
            if stop is None or stop.wait(args.interval):
                return 0
    finally:
        api.close()


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def render(view: Fleet) -> str:
    rows = []
    for d in sorted(view.domains.values(), key=lambda d: d.name):
        for cls, c in sorted(d.classes.items()):
            stranded = sum(c.stranded.values())
            rows.append(
                [
                    d.name,
                    cls,
                    str(c.total),
                    str(c.healthy),
                    str(c.verified),
                    str(c.allocated),
                    str(c.free),
                    str(stranded),
                ]
            )
    for cls, c in sorted(view.totals().items()):
        rows.append(
            [
                "(all)",
                cls,
                str(c.total),
                str(c.healthy),
                str(c.verified),
                str(c.allocated),
                str(c.free),
                str(sum(c.stranded.values())),
            ]
        )
    lines = _table(
        ["FABRIC DOMAIN", "CLASS", "TOTAL", "HEALTHY", "VERIFIED", "ALLOCATED", "FREE", "STRANDED"],
        rows,
    )
    lines.append("")
    domain_rows = [
        [
            d.name,
            str(d.nodes),
            str(d.verifiedNodes),
            str(d.largestFit),
            str(d.freeGpusOnPartialNodes),
            *(str(sum(c.stranded[r] for c in d.classes.values())) for r in STRANDED_REASONS),
        ]
        for d in sorted(view.domains.values(), key=lambda d: d.name)
    ]
    lines += _table(
        [
            "FABRIC DOMAIN",
            "NODES",
            "VERIFIED",
            "LARGEST FIT (NODES)",
            "FREE GPUS ON PARTIAL",
            "STRANDED: COMPUTE DOMAIN",
            "STRANDED: NO FREE NIC",
        ],
        domain_rows,
    )
    lines.append("")
    tier_rows = [
        [
            t["tier"],
            t["name"],
            str(t["nodes"]),
            str(len(t["fabricDomains"])),
            str(t["freeGpus"]),
            str(t["largestGang"]),
            str(t["largestSegment"]),
        ]
        for t in view.tiers()
    ]
    lines += _table(
        [
            "TIER",
            "SWITCH / DOMAIN",
            "NODES",
            "NVLINK DOMAINS",
            "FREE GPUS",
            "LARGEST GANG (NODES)",
            "LARGEST SEGMENT (NODES)",
        ],
        tier_rows,
    )
    lines.append("")
    cd_rows = [
        [
            f"{cd['namespace']}/{cd['name']}",
            cd["fabricDomain"] or "-",
            str(cd["ready"]),
            ",".join(cd["nodes"]) or "-",
        ]
        for cd in view.computeDomains
    ]
    if cd_rows:
        lines += _table(["COMPUTE DOMAIN", "FABRIC DOMAIN", "READY", "NODES"], cd_rows)
    else:
        lines.append("no ComputeDomains")
    so = view.scaleOut
    if so.get("checkedNodes") or so.get("tieredNodes"):
        lines.append("")
        failed = so.get("cablingFailed") or []
        lines.append(
            f"scale-out: {so.get('tieredNodes', 0)} nodes with tier labels, "
            f"{so.get('checkedNodes', 0)} cabling-checked, {len(failed)} failed"
        )
        if failed:
            lines += _table(
                ["CABLING FAILED", "FINDINGS"],
                [[f["node"], "; ".join(f["findings"])] for f in failed],
            )
    return "\n".join(lines)


def render_defrag(plan: Defrag, limit: int) -> str:
    """The NVLink domains the fewest evictions would free whole, best first (`limit` of them)."""
    out = plan.to_json()
    lines = [f"DEFRAG: {DEFRAG_NOTE}."]
    if out["freeDomains"]:
        lines.append("NVLink domains free whole already: " + ", ".join(out["freeDomains"]))
    rows = []
    for c in out["candidates"][:limit]:
        for i, w in enumerate(c["workloads"]):
            rows.append(
                [
                    c["fabricDomain"] if i == 0 else "",
                    f"{c['nodesFreed']}/{c['nodes']}" if i == 0 else "",
                    str(len(c["workloads"])) if i == 0 else "",
                    f"{w['kind']} {w['namespace']}/{w['name']}",
                    str(w["gpus"]),
                ]
            )
    if rows:
        lines += _table(
            ["NVLINK DOMAIN", "NODES FREED", "EVICTIONS", "WORKLOAD", "GPUS"],
            rows,
        )
    elif not out["freeDomains"]:
        lines.append("no NVLink domain to free")
    return "\n".join(lines)
