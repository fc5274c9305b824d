"""The unit tier needs nothing (README): no unit test module renders the chart with the real
helm or asks for a control plane or node cluster, and every integration module carries the
`integration` marker."""

from __future__ import annotations

import ast
from pathlib import Path

from .sources import parsed

TESTS = Path(__file__).resolve().parents[1]
# What builds a Go binary as soon as it is used: the helm harness (`Chart()` runs build.sh
# --helm when helm is missing). The control plane and node clusters come through fixtures
# (below); importing their modules to test the harness's own logic needs nothing.
NEEDS_BINARIES = ("e2e.harness.helm",)
FIXTURES_NEEDING_BINARIES = {
    "control_plane",
    "kube_scheduler",
    "kube_controller_manager",
    "node_cluster",
    "cluster",
    "multi_node_cluster",
}


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_no_unit_test_needs_a_go_binary() -> None:
    found = []
    for path in sorted((TESTS / "unit").glob("*.py")):
        tree = parsed(path)
        bad = sorted(
            n for n in _imports(tree) for m in NEEDS_BINARIES if n == m or n.startswith(m + ".")
        )
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
                bad += sorted({a.arg for a in fn.args.args} & FIXTURES_NEEDING_BINARIES)
        if bad:
            found.append(f"{path.name}: {', '.join(bad)}")
    assert found == [], "move these to tests/integration (marker `integration`)"


def test_every_integration_module_is_marked_integration() -> None:
    unmarked = []
    for path in sorted((TESTS / "integration").glob("test_*.py")):
        tree = parsed(path)
        marks = [
            ast.unparse(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        ]
        if not any("pytest.mark.integration" in m for m in marks):
            unmarked.append(path.name)
    assert unmarked == []
