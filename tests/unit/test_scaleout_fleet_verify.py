"""The cabling check shows where operators look (issue 27 point 5): `fabricdra fleet` names
each failed node with its findings, and `fabricdra verify --cabling-of NODE` fails on the
controller's Failed record (or its absence: never a pass it did not see)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fabricdra.api import labels
from fabricdra.cli import main
from fabricdra.cli import verify as verify_cli
from fabricdra.cli.fleet import render
from fabricdra.controller.fleet import fleet

FINDING = "ibp79s0 (rail 2) reaches leaf 0xb8599f0300a00103; rail 2 of this block is leaf 0x…102"


def _node(name: str, tier: str | None, record: dict[str, Any] | None) -> dict[str, Any]:
    lab = {labels.TIER_1: tier} if tier else {}
    ann = {labels.CABLING_CHECK: json.dumps(record)} if record else {}
    return {"metadata": {"name": name, "labels": lab, "annotations": ann}, "spec": {}}


NODES = [
    _node("dgx001", "su1", {"result": "Passed", "leaves": 8, "railOptimised": True}),
    _node("dgx009", None, {"result": "Failed", "findings": [FINDING]}),
    _node("cpu1", None, None),
]


def test_fleet_names_the_failed_nodes() -> None:
    view = fleet([], [], [], [], NODES)
    assert view.to_json()["scaleOut"] == {
        "tieredNodes": 1,
        "checkedNodes": 2,
        "cablingFailed": [{"node": "dgx009", "findings": [FINDING]}],
    }
    out = render(view)
    assert "scale-out: 1 nodes with tier labels, 2 cabling-checked, 1 failed" in out
    row = next(line for line in out.splitlines() if line.startswith("dgx009"))
    assert FINDING in row


def test_fleet_without_scale_out_says_nothing_of_it() -> None:
    assert "scale-out" not in render(fleet([], [], [], [], [_node("cpu1", None, None)]))


def test_cabling_verdict_reads_the_record_and_never_passes_without_one() -> None:
    assert verify_cli.cabling_verdict(NODES[1], "dgx009")["result"] == "Failed"
    assert verify_cli.cabling_verdict(NODES[0], "dgx001")["result"] == "Passed"
    assert verify_cli.cabling_verdict(NODES[2], "cpu1")["result"] == "NotRun"
    assert verify_cli.cabling_verdict(None, "gone")["findings"] == ["no Node gone"]


@pytest.mark.parametrize(
    ("node", "code", "line"),
    [
        (NODES[0], 0, "SCALE-OUT CABLING (x): Passed"),
        (NODES[1], 1, f"SCALE-OUT CABLING (x): Failed: {FINDING}"),
        (NODES[2], 1, "SCALE-OUT CABLING (x): NotRun: no cabling record"),
    ],
)
def test_verify_holds_the_run_to_the_cabling_record(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    node: dict[str, Any],
    code: int,
    line: str,
) -> None:
    monkeypatch.setattr(verify_cli, "_cabling", lambda a: verify_cli.cabling_verdict(node, "x"))
    assert main(["verify", "--sample", "--no-bandwidth", "--cabling-of", "x"]) == code
    assert line in capsys.readouterr().out
