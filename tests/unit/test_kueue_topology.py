"""The Kueue Topology fabricdra's labels make (fabricdra.api.kueue): widest level first, the
NVLink domain below the switches, the node last (Kueue assigns pods at its lowest level)."""

from __future__ import annotations

import pytest

from fabricdra.api.kueue import topology_levels, topology_object


def test_two_tier_topology_names_spine_leaf_domain_node() -> None:
    assert topology_object("fabric") == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "fabric"},
        "spec": {
            "levels": [
                {"nodeLabel": "fabricdra.io/network.tier-2"},
                {"nodeLabel": "fabricdra.io/network.tier-1"},
                {"nodeLabel": "fabricdra.io/fabric.domain"},
                {"nodeLabel": "kubernetes.io/hostname"},
            ]
        },
    }


def test_tier_count_picks_the_switch_levels() -> None:
    assert topology_levels(3)[:3] == [
        "fabricdra.io/network.tier-3",
        "fabricdra.io/network.tier-2",
        "fabricdra.io/network.tier-1",
    ]
    assert topology_levels(0) == ["fabricdra.io/fabric.domain", "kubernetes.io/hostname"]


@pytest.mark.parametrize("tiers", [-1, 4])
def test_bad_tier_count_is_refused_by_name(tiers: int) -> None:
    with pytest.raises(ValueError, match=rf"0\.\.3 switch tiers .* not {tiers}"):
        topology_levels(tiers)


def test_nameless_topology_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        topology_object("")
