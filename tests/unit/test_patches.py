"""Typed helpers for what the controller writes (kube/patches.py): conditional patches and
conditions are made in one place; the last test reads the controller's source so none is
hand-built again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fabricdra.kube.patches import condition, conditional

from .sources import parsed

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "kube" / "fabricdra" / "kube" / "patches.py"
# rest.py's watch query names resourceVersion as a query parameter, not an object's field.
QUERIES = ROOT / "kube" / "fabricdra" / "kube" / "rest.py"


def test_a_conditional_patch_keeps_its_metadata() -> None:
    patch = conditional("7", {"metadata": {"finalizers": ["f"]}, "status": {"x": 1}})
    assert patch == {
        "metadata": {"finalizers": ["f"], "resourceVersion": "7"},
        "status": {"x": 1},
    }


def test_a_conditional_patch_replaces_a_stale_version_and_copies() -> None:
    original = {"metadata": {"resourceVersion": "1"}, "spec": {}}
    assert conditional("2", original)["metadata"] == {"resourceVersion": "2"}
    assert original["metadata"] == {"resourceVersion": "1"}  # the caller's dict is untouched


def test_a_patch_without_a_version_is_refused() -> None:
    with pytest.raises(ValueError, match="resourceVersion"):
        conditional("", {"status": {}})


def test_a_condition() -> None:
    assert condition("Ready", "False", "Why", "what", now="2026-01-02T03:04:05Z") == {
        "type": "Ready",
        "status": "False",
        "reason": "Why",
        "message": "what",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }


def test_no_controller_module_hand_builds_a_version_or_condition() -> None:
    found = []
    sources = [
        *(ROOT / "controller" / "fabricdra").rglob("*.py"),
        *(ROOT / "kube" / "fabricdra").rglob("*.py"),
    ]
    for path in sorted(sources):
        if path in (HELPERS, QUERIES):
            continue
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.Dict):
                continue
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if keys & {"resourceVersion", "lastTransitionTime"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"use kube/patches.py (conditional, condition): {found}"
