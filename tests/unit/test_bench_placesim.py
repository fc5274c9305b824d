"""bench/placesim.py, the placement half of bench/scale.py (issue 28 point 7): the fabric is
NVL72-shaped with three switch tiers, and the two placers differ where they must."""

from __future__ import annotations

from bench import placesim


def test_the_fabric_is_nvl72_racks_under_32_node_blocks_and_two_tiers_above() -> None:
    assert [placesim.domain_of(i) for i in (0, 17, 18, 35, 36)] == [
        "nvl72-0000", "nvl72-0000", "nvl72-0001", "nvl72-0001", "nvl72-0002",
    ]  # fmt: skip
    assert placesim.tiers_of(31) == ("leaf-000", "spine-00", "core-00")
    assert placesim.tiers_of(32) == ("leaf-001", "spine-00", "core-00")
    assert placesim.tiers_of(256) == ("leaf-008", "spine-01", "core-00")
    assert placesim.tiers_of(1024) == ("leaf-032", "spine-04", "core-01")


def test_fabricdra_keeps_a_gang_in_one_rack_where_first_fit_flat_splits_it() -> None:
    fleet_a, fleet_b = placesim.Fleet(36), placesim.Fleet(36)
    first = placesim.Job("a", 12, 12, 0.0, 1.0)
    second = placesim.Job("b", 18, 18, 0.0, 1.0)
    for fleet, placer in ((fleet_a, placesim.fabricdra), (fleet_b, placesim.flat)):
        got = placer(fleet, first)
        assert got is not None
        fleet.set(got, False)
    got_a, got_b = placesim.fabricdra(fleet_a, second), placesim.flat(fleet_b, second)
    assert got_a is not None
    assert got_b is not None
    assert {placesim.domain_of(i) for i in got_a} == {"nvl72-0001"}
    assert {placesim.domain_of(i) for i in got_b} == {"nvl72-0000", "nvl72-0001"}


def test_the_arrival_sequence_is_the_same_for_both_placers_and_reproducible() -> None:
    one = placesim.simulate(360, 200, seed=7)
    assert one == placesim.simulate(360, 200, seed=7)
    assert one["fabricdra"]["jobs"] == one["flat_first_fit"]["jobs"] == 200
    assert one["fabricdra"]["single_domain_gangs_split_over_nvlink_domains"] == 0
    assert one["flat_first_fit"]["single_domain_gangs_split_over_nvlink_domains"] > 0
    if not placesim.SPANNING:  # no spanning-gang placer in this tree: none placed
        assert one["fabricdra"]["multi_domain_placed"] == 0
