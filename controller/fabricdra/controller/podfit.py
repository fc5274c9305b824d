"""Whether a gang's pods can run on a node, for causes beyond the node's own state (pure).

capacity.py counts a node that is Ready, schedulable and has a free GPU. A gang placed where
its pods still cannot run waits out its gang timeout, is released, and (its pods' claims
being pinned there) is placed in the same rack again, for ever, while another rack is free
(issue 28 point 4c). Two such causes are known before any pod exists, from the domain's spec:

* a NoSchedule or NoExecute taint its pods do not tolerate (`spec.tolerations`, matched as
  kube-scheduler matches a pod's tolerations). A taint at least half of the NVLink fabric
  nodes carry is not counted: it is the fleet's convention, not a tray's condition, and a
  workload running here must tolerate it (counting it would park every gang of a fleet
  tainted wholesale, e.g. `nvidia.com/gpu:NoSchedule` on every GPU node);
* fewer free GPUs than each pod uses (`spec.parallelism.gpusPerNode`; without it, one, as
  capacity.py counts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fabricdra.api.computedomain import ComputeDomainSpec, Toleration
from fabricdra.api.jsontypes import JSON

_BLOCKING = ("NoSchedule", "NoExecute")


def tolerates(toleration: Toleration, taint: Mapping[str, str]) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    if toleration.effect and toleration.effect != taint.get("effect"):
        return False
    if toleration.key and toleration.key != taint.get("key"):
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == (taint.get("value") or "")


def _blocking(node: JSON) -> list[dict[str, str]]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("effect") in _BLOCKING]


def _ident(taint: Mapping[str, str]) -> tuple[str, str, str]:
    return (taint.get("key", ""), taint.get("value") or "", taint.get("effect", ""))


def fleet_taints(nodes: Iterable[JSON]) -> frozenset[tuple[str, str, str]]:
    """The blocking taints (key, value, effect) at least half of `nodes` carry: a fleet's
    convention (every GPU node tainted, a freshly added one not yet), not a tray's condition.
    "Every node" would flip on one node without it and park every gang of the fleet."""
    counts: Counter[tuple[str, str, str]] = Counter()
    total = 0
    for node in nodes:
        total += 1
        counts.update({_ident(t) for t in _blocking(node)})
    return frozenset(t for t, n in counts.items() if 2 * n >= total)


def untolerated(
    node: JSON, tolerations: Sequence[Toleration], common: frozenset[tuple[str, str, str]]
) -> str:
    """The first blocking taint of `node` the tolerations do not tolerate ("" if none)."""
    for taint in _blocking(node):
        if _ident(taint) in common:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return f"tainted {taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}"
    return ""


@dataclass(frozen=True)
class PodNeeds:
    """What each of a gang's pods needs of a node, from its domain's spec."""

    tolerations: tuple[Toleration, ...] = ()
    gpus: int = 1

    @classmethod
    def of(cls, spec: ComputeDomainSpec) -> PodNeeds:
        gpus = spec.parallelism.gpusPerNode if spec.parallelism else 1
        return cls(tuple(spec.tolerations), gpus)


def narrow(
    fabrics: Mapping[str, list[str]],
    node: Mapping[str, JSON],
    needs: PodNeeds,
    gpu_room: Mapping[str, int],
    common: frozenset[tuple[str, str, str]],
    keep: Iterable[str] = (),
) -> dict[str, list[str]]:
    """`fabrics` (fabric -> counted nodes) without the nodes the gang's pods cannot run on:
    an untolerated taint, or fewer free GPUs than a pod uses (a node publishing no GPU is
    judged by capacity.py alone). `keep`: nodes the gang holds (their GPUs are its own)."""
    held = set(keep)
    out: dict[str, list[str]] = {}
    for fabric, names in fabrics.items():
        out[fabric] = [
            n
            for n in names
            if n in held
            or (
                not untolerated(node.get(n) or {}, needs.tolerations, common)
                and gpu_room.get(n, needs.gpus) >= needs.gpus
            )
        ]
    return out
