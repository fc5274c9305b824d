"""The Kubernetes Workload API as the ComputeDomain controller reads it (docs/compute-domains.md,
"Workload API"): the PodGroup a domain's pods belong to gives a domain without `numNodes` its
gang size, and its topology constraint the node label the gang stays within one value of.

Kubernetes 1.36 (k8s.io/api scheduling/v1alpha2/types.go): `scheduling.k8s.io/v1alpha2`
PodGroup, served with the GenericWorkload gate and that API version enabled; a gang's size is
`spec.schedulingPolicy.gang.minCount` (GangScheduling, KEP-4671); its topology constraint is
`spec.schedulingConstraints.topology[0].key`, a node label key all its pods share one value of
(TopologyAwareWorkloadScheduling, KEP-5732; one constraint at most in 1.36). A pod names its
group in `spec.schedulingGroup.podGroupName` (core/v1 types.go; `workloadRef` until 1.35).

How a domain finds its group: by its pods, which reference its workload claim template by name
(`spec.resourceClaims[].resourceClaimTemplateName`). Not by its claims' `reservedFor`: a claim
is reserved only once its pod is scheduled, after the gang must be placed; and a channel claim
is one node's, so never a PodGroup's shared claim (KEP-5729), which is one allocation for pods
on many nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fabricdra.api.jsontypes import JSON
from fabricdra.kube.rest import Kind, NotFound

PODGROUPS = Kind("scheduling.k8s.io", "v1alpha2", "podgroups", True)
# Pod index: "<namespace>/<claim template name>" for each template a pod in a group names.
BY_TEMPLATE = "by-template"
# Pod index: "<namespace>/<PodGroup name>".
BY_GROUP = "by-group"

log = logging.getLogger("fabricdra.controller")
# How group_of says the pods' PodGroup is not there (yet): its workload controller makes it.
MISSING = "does not exist yet"


def served(call: Callable[[str, str], JSON]) -> bool:
    """Whether the API server serves PodGroups (`call`: Rest.call). Off (the 1.36 default):
    the controller runs without the Workload API and every domain needs `numNodes`."""
    try:
        doc = call("GET", f"/apis/{PODGROUPS.group}/{PODGROUPS.version}")
    except NotFound:
        return False
    return any(r.get("name") == PODGROUPS.plural for r in doc.get("resources") or [])


def group_name(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") or "")


def pod_view(pod: JSON) -> JSON:
    """What is kept of a Pod (an informer transform: every pod of the cluster is cached): its
    name, its group and the claim templates it names; nothing else."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    group = group_name(pod)
    templates = [
        {"resourceClaimTemplateName": c["resourceClaimTemplateName"]}
        for c in spec.get("resourceClaims") or []
        if isinstance(c, dict) and c.get("resourceClaimTemplateName")
    ]
    view: JSON = {}
    if group:
        view["schedulingGroup"] = {"podGroupName": group}
    if templates:
        view["resourceClaims"] = templates
    kept = ("name", "namespace", "uid", "resourceVersion")
    return {"metadata": {k: meta[k] for k in kept if k in meta}, "spec": view}


def pod_templates(pod: Mapping[str, Any]) -> list[str]:
    """BY_TEMPLATE values of a pod (view): the claim templates it names, in or out of a group
    (a domain's pods out of any group say the domain is elastic)."""
    ns = (pod.get("metadata") or {}).get("namespace", "")
    claims = (pod.get("spec") or {}).get("resourceClaims") or []
    names = {c["resourceClaimTemplateName"] for c in claims if c.get("resourceClaimTemplateName")}
    return sorted(f"{ns}/{n}" for n in names)


def pod_group(pod: Mapping[str, Any]) -> list[str]:
    """BY_GROUP value of a pod (view)."""
    group = group_name(pod)
    return [f"{(pod.get('metadata') or {}).get('namespace', '')}/{group}"] if group else []


def domain_template(domain: Mapping[str, Any]) -> list[str]:
    """BY_TEMPLATE value of a ComputeDomain: its workload claim template."""
    spec = domain.get("spec") or {}
    channel = spec.get("channel") if isinstance(spec, dict) else None
    ref = channel.get("resourceClaimTemplate") if isinstance(channel, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    namespace = (domain.get("metadata") or {}).get("namespace", "")
    return [f"{namespace}/{name}"] if isinstance(name, str) and name else []


@dataclass(frozen=True)
class Group:
    name: str
    min_count: int  # the gang size
    topology_key: str = ""  # "" without a topology constraint

    def status(self) -> JSON:
        """As ComputeDomain.status.podGroup records it."""
        return {"name": self.name, "minCount": self.min_count, "topologyKey": self.topology_key}


def gang_of(podgroup: Mapping[str, Any]) -> Group | None:
    """The gang a PodGroup declares; None for a basic (not gang) policy: such a group has no
    size to take, and the domain stays elastic."""
    spec = podgroup.get("spec") or {}
    gang = (spec.get("schedulingPolicy") or {}).get("gang") or {}
    count = gang.get("minCount")
    if not isinstance(count, int) or count < 1:
        return None
    topology = (spec.get("schedulingConstraints") or {}).get("topology") or []
    key = str(topology[0].get("key") or "") if topology and isinstance(topology[0], dict) else ""
    return Group(str((podgroup.get("metadata") or {}).get("name", "")), count, key)


def group_of(
    namespace: str,
    template: str,
    pods: Iterable[Mapping[str, Any]],
    podgroup: Callable[[str], JSON | None],
) -> tuple[Group | None, str]:
    """The gang of the domain whose workload claim template is `namespace`/`template`, from
    its `pods` (those naming the template: BY_TEMPLATE) and `podgroup` ("ns/name" -> object).
    Returns (group, why not: "" when found or when no pod of it is in a group). Pods of several
    groups give none: which one's size would be the domain's is not for the controller to
    guess (set numNodes). Pods in no group are not counted."""
    names = sorted({group_name(p) for p in pods} - {""})
    if not names:
        return None, ""
    if len(names) > 1:
        return None, (
            f"the pods using claim template {template} belong to several PodGroups "
            f"({', '.join(names)}); set numNodes"
        )
    obj = podgroup(f"{namespace}/{names[0]}")
    if obj is None:
        return None, f"PodGroup {names[0]} (named by the domain's pods) {MISSING}"
    group = gang_of(obj)
    if group is None:
        return None, ""  # a basic policy: no gang
    return group, ""


def narrow_to_topology(
    fabrics: Mapping[str, list[str]],
    key: str,
    label: Callable[[str], str],
    free: Callable[[str], bool],
) -> dict[str, list[str]]:
    """A topology constraint (KEP-5732) applied to placement's candidates: per fabric domain,
    only its nodes sharing the one value of node label `key` (`label`: node -> its value, ""
    when unlabelled) that has the most nodes free for the gang (`free`; ties by value), so
    best fit counts only room the scheduler can give the gang without breaking the constraint.
    Unlabelled nodes never count (the scheduler would not place the gang on them)."""
    out: dict[str, list[str]] = {}
    for fabric, nodes in fabrics.items():
        groups: dict[str, list[str]] = {}
        for n in nodes:
            value = label(n)
            if value:
                groups.setdefault(value, []).append(n)
        if groups:
            best = max(sorted(groups), key=lambda v: sum(1 for n in groups[v] if free(n)))
            out[fabric] = groups[best]
        else:
            out[fabric] = []
    return out
