"""The placer for gangs larger than one NVLink domain (controller/hierarchy.py): fewest fabric
domains under the lowest switch tier with room, shares in whole segments or TPxEP groups, and
waiting whole with a message that says what for."""

from __future__ import annotations

import pytest

from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.controller import hierarchy
from fabricdra.controller.hierarchy import ANY, Plan, Switches, Wait, place


def _switches(**tiers: tuple[str | None, ...]) -> Switches:
    return Switches(dict(tiers))


# Four NVL72 racks of 18 trays: r1, r2 under leaf l1; r3 under leaf l2; r1..r3 under spine s1;
# r4 under spine s2; everything under core c1.
FLEET = _switches(
    r1=("l1", "s1", "c1"),
    r2=("l1", "s1", "c1"),
    r3=("l2", "s1", "c1"),
    r4=("l3", "s2", "c1"),
)


def test_a_gang_larger_than_a_rack_goes_to_the_fewest_racks_under_the_lowest_tier() -> None:
    # 30 nodes: r1+r2 (under one leaf) have 18+12; r3+r4 have more room but only share the core.
    plan = place(30, {"r1": 18, "r2": 12, "r3": 18, "r4": 18}, FLEET)
    assert plan == Plan({"r1": 18, "r2": 12}, "tier-1", "l1")


def test_the_lowest_tier_wins_over_fewer_domains_above_it() -> None:
    # Under leaf l1 three racks would be needed; no leaf has them: spine s1 does, with two.
    fleet = _switches(
        r1=("l1", "s1", "c1"), r2=("l1", "s1", "c1"), r3=("l2", "s1", "c1"), r4=("l3", "s2", "c1")
    )
    plan = place(30, {"r1": 10, "r2": 10, "r3": 18, "r4": 18}, fleet)
    assert isinstance(plan, Plan)
    assert plan.tier == "tier-2"
    assert plan.switch == "s1"
    assert plan.shares == {"r3": 18, "r1": 10, "r2": 2}


def test_best_fit_among_switches_keeps_the_larger_switch_whole() -> None:
    fleet = _switches(a1=("l1",), a2=("l1",), b1=("l2",), b2=("l2",))
    # 24 fits under l1 (18+8 = 26 free) and under l2 (18+18): the tighter l1 is taken.
    plan = place(24, {"a1": 18, "a2": 8, "b1": 18, "b2": 18}, fleet)
    assert isinstance(plan, Plan)
    assert plan.switch == "l1"
    assert plan.shares == {"a1": 18, "a2": 6}


def test_remainder_goes_to_the_tightest_hole() -> None:
    fleet = _switches(a=("l1",), b=("l1",), c=("l1",))
    plan = place(22, {"a": 18, "b": 4, "c": 17}, fleet)
    # fewest domains: 18 + 4 (exact) rather than 18 + 17.
    assert isinstance(plan, Plan)
    assert plan.shares == {"a": 18, "b": 4}


def test_required_tier_waits_whole_and_says_for_what() -> None:
    # Room for 36 exists only across spines: with tier-2 required, the gang waits, no share.
    out = place(36, {"r1": 18, "r2": 0, "r3": 10, "r4": 18}, FLEET, required="tier-2")
    assert isinstance(out, Wait)
    assert "under one tier-2 switch" in out.message
    assert "most room under one tier-2 switch is 28" in out.message


def test_without_required_it_goes_above_every_tier_rather_than_wait() -> None:
    fleet = _switches(a=("l1", "s1", None), b=("l2", "s2", None))
    plan = place(30, {"a": 18, "b": 18}, fleet)
    assert isinstance(plan, Plan)
    assert plan.tier == ANY
    assert sum(plan.shares.values()) == 30


def test_nodes_without_a_tier_label_claim_no_closeness() -> None:
    fleet = _switches(a=(None, "s1", "c1"), b=(None, "s1", "c1"))
    plan = place(20, {"a": 18, "b": 18}, fleet)
    assert isinstance(plan, Plan)
    assert plan.tier == "tier-2"
    assert isinstance(place(20, {"a": 18, "b": 18}, fleet, required="tier-1"), Wait)


def test_required_tier_without_any_tier_label_says_so() -> None:
    out = place(4, {"a": 18}, _switches(a=(None, None, None)), required="tier-1")
    assert isinstance(out, Wait)
    assert f"no NVLink fabric domain's nodes carry one {TIER_LABELS[0]} label" in out.message


def test_segments_pack_into_holes_that_fit() -> None:
    # Slurm --segment=4: a 12-node job into three 4-node segments across holes of 5, 6 and 9;
    # no single hole has 12.
    fleet = _switches(a=("l1",), b=("l1",), c=("l1",))
    plan = place(12, {"a": 5, "b": 6, "c": 9}, fleet, atom=4)
    assert isinstance(plan, Plan)
    assert all(n % 4 == 0 for n in plan.shares.values())
    assert sum(plan.shares.values()) == 12
    # c takes two segments; the third goes to the tightest hole that holds one (a: 5).
    assert plan.shares == {"c": 8, "a": 4}
    assert hierarchy.segments(plan.shares, 4) == sorted(
        [(f, k) for f, n in plan.shares.items() for k in range(n // 4)]
    )


def test_segments_never_straddle_domains_so_rounded_down_room_can_make_it_wait() -> None:
    fleet = _switches(a=("l1",), b=("l1",), c=("l1",))
    # 5 + 6 + 7 = 18 nodes free, but only 4 + 4 + 4 in whole 4-node segments.
    out = place(16, {"a": 5, "b": 6, "c": 7}, fleet, atom=4, required="tier-1")
    assert isinstance(out, Wait)
    assert "is 12 node(s)" in out.message


def test_tp_ep_groups_stay_inside_one_domain() -> None:
    # GB200 NVL72: 4 GPUs per tray; a TPxEP group of 32 GPUs is 8 trays; 24 nodes = 3 groups.
    fleet = _switches(a=("l1",), b=("l1",))
    plan = place(24, {"a": 18, "b": 10}, fleet, atom=8)
    assert isinstance(plan, Plan)
    assert plan.shares == {"a": 16, "b": 8}


def test_switches_of_nodes() -> None:
    def node(name: str, **tiers: str) -> dict[str, object]:
        labels = {TIER_LABELS[int(k[-1]) - 1]: v for k, v in tiers.items()}
        return {"metadata": {"name": name, "labels": labels}}

    nodes = {
        "a1": node("a1", t1="l1", t2="s1"),
        "a2": node("a2", t1="l1", t2="s1"),
        "b1": node("b1", t1="l1", t2="s1"),
        "b2": node("b2", t1="l2", t2="s1"),  # b's trays hang under two leaves
    }
    sw = Switches.of({"a": ["a1", "a2"], "b": ["b1", "b2"]}, nodes.get)
    assert sw.by_fabric == {"a": ("l1", "s1", None), "b": (None, "s1", None)}


def test_shares_must_be_whole() -> None:
    with pytest.raises(ValueError, match="not whole shares of 4"):
        place(10, {"a": 18}, _switches(a=("l1",)), atom=4)
