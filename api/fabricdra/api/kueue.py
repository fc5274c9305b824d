"""Kueue's view of fabricdra's placement tree: a Kueue `Topology` (kueue.x-k8s.io/v1beta2) whose
levels are the node labels fabricdra publishes, widest first, down to the node.

Kueue's topology-aware scheduling (https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/)
places a job's pods by these node labels: `kueue.x-k8s.io/podset-required-topology:
fabricdra.io/network.tier-1` keeps a job under one leaf switch, and
`kueue.x-k8s.io/podset-slice-required-topology: fabricdra.io/fabric.domain` keeps each slice
inside one NVLink domain. Pure: shared by the CLI (`fabricdra topology -o kueue`) and the tests
that run Kueue for real.
"""

from __future__ import annotations

from typing import Any

from fabricdra.api.labels import FABRIC_DOMAIN
from fabricdra.api.scaleout import TIER_LABELS

# Kueue serves v1beta2 from v0.15, stores it from v0.16 and drops v1beta1 in v0.17
# (https://github.com/kubernetes-sigs/kueue/issues/7626); `fabricdra topology
# --kueue-api-version` for older ones.
API_VERSION = "kueue.x-k8s.io/v1beta2"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_TIERS = 2  # leaf (tier-1) and spine (tier-2): the common two-tier rail-optimised fabric


def topology_levels(tiers: int = DEFAULT_TIERS, *, fabric_domain: bool = True) -> list[str]:
    """The node labels of the Topology's levels, widest first: the `tiers` switch tiers above
    the node (tier-`tiers` .. tier-1), the NVLink domain (unless `fabric_domain` is false),
    the node itself."""
    if not 0 <= tiers <= len(TIER_LABELS):
        raise ValueError(
            f"a Kueue topology has 0..{len(TIER_LABELS)} switch tiers (the tier labels "
            f"fabricdra publishes: {', '.join(TIER_LABELS)}), not {tiers}"
        )
    switches = list(reversed(TIER_LABELS[:tiers]))
    return [*switches, *([FABRIC_DOMAIN] if fabric_domain else []), HOSTNAME_LABEL]


def topology_object(
    name: str,
    tiers: int = DEFAULT_TIERS,
    *,
    fabric_domain: bool = True,
    api_version: str = API_VERSION,
) -> dict[str, Any]:
    """The Kueue `Topology` named `name` (levels: see topology_levels)."""
    if not name:
        raise ValueError("a Kueue Topology needs a name")
    levels = topology_levels(tiers, fabric_domain=fabric_domain)
    return {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


__all__ = ["API_VERSION", "HOSTNAME_LABEL", "topology_levels", "topology_object"]
