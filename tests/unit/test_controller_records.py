"""The status patch that records a domain's decisions before anything is made from them
(controller/records.py, issue 22 point 1)."""

from __future__ import annotations

from fabricdra.controller.records import decisions_patch


def test_records_what_status_does_not_show_yet_conditionally() -> None:
    assert decisions_patch({}, "7", 3, "rack-a") == {
        "metadata": {"resourceVersion": "7"},
        "status": {"channels": [3], "fabricDomain": "rack-a"},
    }
    # An elastic domain (no placement): the channel only.
    assert decisions_patch({}, "7", 3, None) == {
        "metadata": {"resourceVersion": "7"},
        "status": {"channels": [3]},
    }
    # A gang placed again elsewhere: the new placement, before the template follows it.
    assert decisions_patch({"channels": [3], "fabricDomain": "rack-a"}, "9", 3, "rack-b") == {
        "metadata": {"resourceVersion": "9"},
        "status": {"fabricDomain": "rack-b"},
    }


def test_nothing_to_write_when_recorded() -> None:
    assert decisions_patch({"channels": [3], "fabricDomain": "rack-a"}, "7", 3, "rack-a") is None
    assert decisions_patch({"channels": [3]}, "7", 3, None) is None
