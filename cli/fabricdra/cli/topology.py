"""`fabricdra topology`: the cluster's scale-out tree from the published records, and
`fabricdra fabric-dump`: an ibnetdiscover dump into the ConfigMap the controller reads
(docs/cli.md, docs/scale-out.md).

fabricdra topology [--kubeconfig K] [-o table|json|slurm|kueue] [--name N]
fabricdra fabric-dump --fabric F --file PATH [--namespace NS] [--kubeconfig K]

The tree is what the Nodes say (the controller's fabricdra.io/network.tier-1/-2/-3 labels,
the node agent's fabricdra.io/fabric.domain, the cabling record) and what the NodeDevices
records say of each NIC (rail, role, neighbour): never computed again here, so what this
prints is what schedulers key on.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from fabricdra.api import labels
from fabricdra.api.kueue import API_VERSION as KUEUE_API_VERSION
from fabricdra.api.kueue import HOSTNAME_LABEL
from fabricdra.api.kueue import topology_object as kueue_topology
from fabricdra.api.scaleout import TIER_LABELS

from .common import UsageError, api_client, print_json
from .common import env as _env

USER_AGENT = "fabricdra-topology/0.2.0"
# The ConfigMap `fabric-dump` writes: the controller reads those labelled DUMP_LABEL in its
# namespace (controller/tierlabels.py), the dump gzipped (a large fabric's text outgrows a
# ConfigMap's 1 MiB: https://kubernetes.io/docs/concepts/configuration/configmap/).
DUMP_LABEL = labels.PREFIX + "ibnetdiscover"  # = controller/tierlabels.py's
DUMP_KEY_GZ = "ibnetdiscover.txt.gz"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "topology",
        help="print the cluster's scale-out tree "
        "(table, json, Slurm topology.yaml, Kueue Topology)",
        description="Read Nodes and NodeDevices and print the scale-out tree they publish: "
        "each node's tier labels, NVLink domain, cabling check and NICs (table or json), "
        "Slurm's topology.yaml (tree from the tiers, block from the NVLink domains), or a "
        "Kueue Topology whose levels are the tier labels, the NVLink domain and the hostname.",
    )
    p.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file; default: the in-cluster service account [FABRICDRA_KUBECONFIG]",
    )
    p.add_argument("-o", "--output", choices=["table", "json", "slurm", "kueue"], default="table")
    p.add_argument(
        "--name", default="fabricdra-scale-out", help="the Kueue Topology's / Slurm topology's name"
    )
    p.add_argument(
        "--kueue-api-version",
        choices=["v1beta2", "v1beta1"],
        default="v1beta2",
        help="-o kueue: the Topology's API version (v1beta1 for Kueue before v0.15; default "
        "v1beta2)",
    )
    p.set_defaults(run=run)
    d: argparse.ArgumentParser = sub.add_parser(
        "fabric-dump",
        help="store an ibnetdiscover dump in the ConfigMap the controller reads",
        description="Read an ibnetdiscover dump (what `ibnetdiscover` printed on a host of the "
        "fabric), refuse it unless it parses, and create or replace the ConfigMap "
        "ibnetdiscover-<fabric> labelled fabricdra.io/ibnetdiscover=<fabric> in --namespace, "
        "the dump gzipped under ibnetdiscover.txt.gz. Run by the chart's scaleOut.fabricDump "
        "CronJobs, one per fabric.",
    )
    d.add_argument("--fabric", required=True, help="the fabric's name (a label value)")
    d.add_argument("--file", required=True, help="the dump, '-' for stdin")
    d.add_argument(
        "--namespace",
        default=_env("NAMESPACE") or "fabricdra-system",
        help="the driver's namespace (default fabricdra-system) [FABRICDRA_NAMESPACE]",
    )
    d.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file; default: the in-cluster service account [FABRICDRA_KUBECONFIG]",
    )
    d.set_defaults(run=run_dump)


# --- the view (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRow:
    name: str
    tiers: tuple[str | None, ...]  # tier-1, tier-2, tier-3 label values (None: absent)
    domain: str | None
    hostname: str
    cabling: Mapping[str, Any] | None
    nics: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)


def rows(nodes: Iterable[Mapping[str, Any]], devices: Iterable[Mapping[str, Any]]) -> list[NodeRow]:
    by_node = {d["metadata"]["name"]: d for d in devices}
    out = []
    for node in nodes:
        meta = node["metadata"]
        lab = meta.get("labels") or {}
        raw = (meta.get("annotations") or {}).get(labels.CABLING_CHECK)
        try:
            cabling = json.loads(raw) if raw else None
        except ValueError:
            cabling = {"result": "Unreadable", "findings": [raw]}
        nics = []
        for iface in ((by_node.get(meta["name"]) or {}).get("spec") or {}).get("interfaces") or []:
            so = iface.get("scaleOut")
            if not iface.get("rdma") or not so:
                continue
            nb = so.get("neighbour") or {}
            nics.append(
                {
                    "name": iface.get("name"),
                    "rdmaDevice": iface.get("rdmaDevice"),
                    "rail": so.get("rail"),
                    "role": so.get("role"),
                    "switch": nb.get("switch"),
                    "port": nb.get("port"),
                    "source": nb.get("source"),
                }
            )
        out.append(
            NodeRow(
                name=meta["name"],
                tiers=tuple(lab.get(k) for k in TIER_LABELS),
                domain=lab.get(labels.FABRIC_DOMAIN),
                hostname=lab.get(HOSTNAME_LABEL) or meta["name"],
                cabling=cabling,
                nics=tuple(nics),
            )
        )
    return sorted(out, key=lambda r: (tuple(t or "~" for t in reversed(r.tiers)), r.name))


def _nic_summary(nics: Iterable[Mapping[str, Any]]) -> str:
    by_role: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for n in nics:
        by_role[str(n.get("role") or "unknown")].append(n)
    parts = []
    for role, group in sorted(by_role.items()):
        rails = sorted(n["rail"] for n in group if n.get("rail") is not None)
        part = f"{len(group)} {role}"
        if rails:
            part += f" (rails {','.join(map(str, rails))})"
        parts.append(part)
    return ", ".join(parts) or "-"


def table(view: list[NodeRow]) -> str:
    head = ("NODE", "TIER-3", "TIER-2", "TIER-1", "NVLINK DOMAIN", "CABLING", "NICS")
    lines = [head]
    for r in view:
        cabling = (r.cabling or {}).get("result", "-")
        if cabling == "Failed":
            cabling += ": " + "; ".join((r.cabling or {}).get("findings") or [])
        t1, t2, t3 = r.tiers
        lines.append(
            (
                r.name,
                t3 or "-",
                t2 or "-",
                t1 or "-",
                r.domain or "-",
                cabling,
                _nic_summary(r.nics),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        for line in lines
    )


def as_json(view: list[NodeRow]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for r in view:
        if not r.tiers[0]:
            continue
        branch = tree
        for value in reversed([t for t in r.tiers if t]):
            branch = branch.setdefault(value, {})
        branch.setdefault("nodes", []).append(r.name)
    return {
        "nodes": [
            {
                "name": r.name,
                "tiers": [t for t in r.tiers if t],
                "fabricDomain": r.domain,
                "cabling": r.cabling,
                "nics": list(r.nics),
            }
            for r in view
        ],
        "tree": tree,
        "untiered": [r.name for r in view if not r.tiers[0]],
    }


def slurm(view: list[NodeRow], name: str) -> str:
    """Slurm's topology.yaml (https://slurm.schedmd.com/topology.yaml.html): a tree topology
    from the tier labels (a switch per tier value, its children the values one tier down, the
    nodes under their tier-1) and a block topology whose blocks are the NVLink domains. Nodes
    with no tier (none known, or failed the cabling check) are left out of the tree."""
    children: dict[str, set[str]] = defaultdict(set)
    nodes_of: dict[str, list[str]] = defaultdict(list)
    switches: list[str] = []
    for r in view:
        chain = [t for t in r.tiers if t]
        if not chain:
            continue
        nodes_of[chain[0]].append(r.name)
        for lower, upper in pairwise(chain):
            children[upper].add(lower)
        for s in reversed(chain):
            if s not in switches:
                switches.append(s)
    tree = []
    for s in switches:
        entry: dict[str, Any] = {"switch": s}
        if children.get(s):
            entry["children"] = ",".join(sorted(children[s]))
        if nodes_of.get(s):
            entry["nodes"] = ",".join(sorted(nodes_of[s]))
        tree.append(entry)
    blocks: dict[str, list[str]] = defaultdict(list)
    for r in view:
        if r.domain and r.domain != labels.NO_FABRIC:
            blocks[r.domain].append(r.name)
    doc: list[dict[str, Any]] = [
        {"topology": name, "cluster_default": True, "tree": {"switches": tree}}
    ]
    if blocks:
        doc.append(
            {
                "topology": f"{name}-nvlink",
                "block": {
                    "blocks": [
                        {"block": b, "nodes": ",".join(sorted(n))}
                        for b, n in sorted(blocks.items())
                    ]
                },
            }
        )
    return yaml.safe_dump(doc, sort_keys=False)


def kueue(
    view: list[NodeRow], name: str, api_version: str = KUEUE_API_VERSION
) -> tuple[dict[str, Any], list[str]]:
    """A Kueue Topology (https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/)
    whose levels are the tiers, broadest first, then the NVLink domain and the hostname. Kueue
    leaves out of topology-aware scheduling a node that lacks any level's label, so a tier or
    the domain is a level only where every tiered node has it; returns the object and the nodes
    Kueue will not place on (no tiers: unknown fabric or a failed cabling check)."""
    tiered = [r for r in view if r.tiers[0]]
    depth = min((sum(1 for t in r.tiers if t) for r in tiered), default=0)
    with_domain = bool(tiered) and all(r.domain and r.domain != labels.NO_FABRIC for r in tiered)
    obj = kueue_topology(name, depth, fabric_domain=with_domain, api_version=api_version)
    return obj, [r.name for r in view if not r.tiers[0]]


# --- I/O -------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from fabricdra.kube.rest import NODE_DEVICES, NODES, ApiError, NotFound, Rest

    api = api_client(args.kubeconfig, USER_AGENT)
    rest = Rest(api)
    try:
        nodes = rest.list(NODES).get("items", [])
        try:
            devices = rest.list(NODE_DEVICES).get("items", [])
        except NotFound:
            devices = []  # no NodeDevices CRD: no NIC facts, the labels still say the tree
    except ApiError as e:
        print(f"fabricdra topology: cannot read the cluster: {e}", file=sys.stderr)
        return 1
    view = rows(nodes, devices)
    if args.output == "table":
        print(table(view))
    elif args.output == "json":
        print_json(as_json(view))
    elif args.output == "slurm":
        print(slurm(view, args.name), end="")
    else:
        obj, left_out = kueue(view, args.name, f"kueue.x-k8s.io/{args.kueue_api_version}")
        print(yaml.safe_dump(obj, sort_keys=False), end="")
        if left_out:
            print(
                f"fabricdra topology: Kueue will not place on {len(left_out)} node(s) with no "
                f"tier labels: {', '.join(left_out)}",
                file=sys.stderr,
            )
    return 0


def dump_configmap(fabric: str, text: str) -> dict[str, Any]:
    """The ConfigMap for one fabric's dump; raises UsageError unless the dump parses."""
    from fabricdra.controller.scaleout import FabricDumpError, parse_ibnetdiscover

    try:
        parsed = parse_ibnetdiscover(text, source="the dump")
    except FabricDumpError as e:
        raise UsageError(f"refusing to store it: {e}") from e
    packed = base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
    return {
        "metadata": {
            "name": f"ibnetdiscover-{fabric}",
            "labels": {DUMP_LABEL: fabric},
            "annotations": {
                labels.PREFIX + "ibnetdiscover.switches": str(len(parsed.switches)),
                labels.PREFIX + "ibnetdiscover.ca-ports": str(len(parsed.ca_ports)),
            },
        },
        "binaryData": {DUMP_KEY_GZ: packed},
    }


def run_dump(args: argparse.Namespace) -> int:
    from fabricdra.kube.rest import CONFIG_MAPS, ApiError, Conflict, Rest

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as e:
        raise UsageError(f"--file {args.file}: {e}") from e
    body = dump_configmap(args.fabric, text)
    rest = Rest(api_client(args.kubeconfig, USER_AGENT))
    name = body["metadata"]["name"]
    try:
        try:
            rest.create(CONFIG_MAPS, body, args.namespace)
        except Conflict:
            rest.replace(CONFIG_MAPS, name, body, args.namespace)
    except ApiError as e:
        print(f"fabricdra fabric-dump: cannot write ConfigMap {name}: {e}", file=sys.stderr)
        return 1
    print(f"fabricdra fabric-dump: ConfigMap {args.namespace}/{name} holds the dump")
    return 0
