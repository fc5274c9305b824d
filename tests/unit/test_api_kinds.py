"""What is defined once in api/: the `JSON` alias, and each custom Kind's REST address, which
matches its pydantic model's group, version and plural."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from fabricdra.api import computedomain, nodedevices
from fabricdra.kube import rest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "kube", "cli", "controller", "kubeletplugin", "proto")


def _defining(pattern: re.Pattern[str]) -> list[str]:
    return sorted(
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if pattern.search(path.read_text())
    )


def test_the_json_alias_is_defined_once_in_api() -> None:
    assert _defining(re.compile(r"^JSON\s*(?::\s*TypeAlias\s*)?=", re.M)) == [
        "api/fabricdra/api/jsontypes.py"
    ]


@pytest.mark.parametrize(
    ("kind", "model"),
    [(rest.COMPUTE_DOMAINS, computedomain), (rest.NODE_DEVICES, nodedevices)],
)
def test_each_custom_kinds_rest_address_is_its_models(kind: rest.Kind, model: ModuleType) -> None:
    assert (kind.group, kind.version, kind.plural) == (model.GROUP, model.VERSION, model.PLURAL)
    assert kind.namespaced == (model.CRD.scope == "Namespaced")


def test_a_custom_kinds_rest_address_is_defined_once() -> None:
    # Anywhere else, a version bump in api/ would leave a caller talking to the old version.
    ours = re.compile(r"\bKind\([^)]*(fabricdra\.io|ND_|nodedevices|computedomain|\bcd\.)")
    assert _defining(ours) == ["kube/fabricdra/kube/rest.py"]
