"""Reading the server's version against the ComputeDomain floor (the API features themselves
are checked against real API servers in tests/integration/test_controller_preflight.py)."""

from __future__ import annotations

import pytest

from fabricdra.controller.preflight import Preflight, below_floor


@pytest.mark.parametrize(
    ("major", "minor", "old"),
    [
        ("1", "34", True),
        ("1", "35+", True),  # some distributions add a "+"
        ("1", "36", False),
        ("1", "37", False),
        ("2", "0", False),
        ("", "", False),  # unreadable: not judged by version
    ],
)
def test_below_floor(major: str, minor: str, old: bool) -> None:
    assert below_floor(major, minor) is old


def test_gates_on_by_hand_below_the_floor_are_said_so() -> None:
    message = Preflight("v1.35.2", [], old=True).message()
    assert message.endswith("(feature gates on by hand)")
