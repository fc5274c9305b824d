"""A `Device` carries what every kind has and one typed per-kind payload (issue 31 point 3):
no per-kind optional fields on the model, and the core asks the kinds' hooks instead of
reading a payload (tests/unit/test_kind_conformance.py checks each kind's payload reader)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from fabricdra.kubeletplugin.devices import Device

ROOT = Path(__file__).resolve().parents[2] / "kubeletplugin" / "fabricdra" / "kubeletplugin"
COMMON = ("name", "type", "health", "health_reason", "health_causes", "payload")
# The core: it publishes, prepares and reports every kind through the kinds' hooks.
CORE = (
    "agent.py",
    "assembly.py",
    "devices.py",
    "exclusivity.py",
    "health.py",
    "prepare.py",
    "resourceslices.py",
)


def test_a_device_has_only_the_fields_every_kind_has() -> None:
    assert tuple(f.name for f in dataclasses.fields(Device)) == COMMON


def test_a_device_takes_no_per_kind_field() -> None:
    with pytest.raises(TypeError, match="accelerator"):
        Device("gpu-0", "gpu", "Healthy", None, accelerator=None)  # type: ignore[call-arg]


@pytest.mark.parametrize("module", CORE)
def test_the_core_reads_no_payload(module: str) -> None:
    """Only a kind knows its payload's type: the core asks its hooks (kinds/base.py)."""
    tree = ast.parse((ROOT / module).read_text())
    reads = [
        f"{module}:{node.lineno}"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr == "payload")
        or (isinstance(node, ast.Name) and node.id.endswith("payload_of"))
        or (isinstance(node, ast.Attribute) and node.attr.endswith("payload_of"))
    ]
    assert reads == []
