"""Which compute-domain nodes a gang may count on, per NVLink fabric domain (pure: Node
objects in, names out). Gang placement (placement.py) reads it; `fabricdra fleet`
(fleet.py) can share it, so "room in a fabric domain" means one thing everywhere.

A node counts when it can take a pod of the gang now:

* its `Ready` condition is `True` (a node that is NotReady or Unknown will not run the pod);
* it is schedulable: not cordoned (`spec.unschedulable`), and none of the node-lifecycle
  taints (`node.kubernetes.io/{not-ready,unreachable,unschedulable}`) that keep new pods
  off (other taints are the workload's to tolerate, so they do not count against a node);
* where the verification gate is required (`--require-verified-nodes`), it carries
  `fabricdra.io/verified=true` (docs/verification.md);
* it is not excluded for the gang (the nodes of a fabric domain that failed a gang before:
  placement.py).

Whether it is free (no other domain holds it, no other gang's placement still expects it) is
the placement's part (`placement.free_nodes`): that is ownership, not the node's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Any

from fabricdra.api import labels

from .claims import node_fabric

JSON = dict[str, Any]

# Taints the node lifecycle controller and `kubectl cordon` set: no new pod goes there.
BLOCKING_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
    }
)


def unusable(node: JSON, *, require_verified: bool = False) -> str:
    """Why the node cannot take a gang's pod now ("" when it can)."""
    conds = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conds if c.get("type") == "Ready"), None)
    if ready != "True":
        return f"Ready is {ready or 'not reported'}"
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    for taint in spec.get("taints") or []:
        if taint.get("key") in BLOCKING_TAINTS and taint.get("effect") != "PreferNoSchedule":
            return f"tainted {taint['key']}"
    if require_verified:
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        if node_labels.get(labels.VERIFIED) != "true":
            return f"not verified ({labels.VERIFIED} is not 'true')"
    return ""


def usable_by_fabric(
    nodes: Iterable[JSON], *, require_verified: bool = False, exclude: Set[str] = frozenset()
) -> dict[str, list[str]]:
    """Fabric domain -> the names of its nodes that count (see the module docstring). A
    fabric domain whose nodes all fail is listed with none, so it is still known."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        fabric = node_fabric(node)
        if not fabric:
            continue
        names = out.setdefault(fabric, [])
        name = node["metadata"]["name"]
        if name not in exclude and not unusable(node, require_verified=require_verified):
            names.append(name)
    return out
