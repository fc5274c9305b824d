"""The node agent's import graph (issue 31): read from the source with `ast`, nothing imported.

* No import cycle among kubeletplugin's modules at run time: every `import` counts, those inside
  functions too (a function-local import only postpones the cycle to the first call); imports
  under `if TYPE_CHECKING:` do not run, so they do not count.
* The root holds no family module: NVIDIA's own modules live in kinds/nvidia/, and the model
  (devices.py) imports no family module at run time.
* PCI vendor ids are defined once, in discovery/vendors.py: no other product module spells
  one as a string (`"0x10de"`, `"10de"`) or a hex number (`0x10de`).
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from .sources import parsed

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "kubeletplugin" / "fabricdra" / "kubeletplugin"
PACKAGE = "fabricdra.kubeletplugin"
VENDORS = ROOT / "discovery" / "vendors.py"
# Every product package: a vendor id spelled in any of them is a second definition.
PRODUCT = [REPO / part / "fabricdra" / part for part in ("api", "cli", "controller", "kube")]


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Module name → (file, is a package's __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join([package, *parts])] = (path, is_package)
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs: at module level, in functions and classes, not under
    `if TYPE_CHECKING:` (its `else:` runs)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _type_checking(child):
            for other in child.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _imports(child)


def import_graph(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """Module → the modules of `mods` it imports (the deepest one a dotted name names)."""
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in mods.items():
        wanted: set[str] = set()
        for node in _imports(parsed(path)):
            if isinstance(node, ast.Import):
                wanted.update(a.name for a in node.names)
                continue
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            for alias in node.names:
                # `from . import x` imports the submodule x where there is one.
                sub = f"{base}.{alias.name}"
                wanted.add(sub if sub in mods else base)
        deps = set()
        for dep in wanted:
            while dep and dep not in mods:
                dep = dep.rpartition(".")[0]
            if dep and dep != name:
                deps.add(dep)
                # Importing `a.b.c` first runs the packages `a` and `a.b` it is in: from
                # outside them, a real edge (their __init__ may import back); from inside,
                # they are already being imported.
                package = dep.rpartition(".")[0]
                while package in mods and not f"{name}.".startswith(f"{package}."):
                    if package != PACKAGE:  # the root package (empty) is above every module
                        deps.add(package)
                    package = package.rpartition(".")[0]
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_the_kubelet_plugin() -> None:
    found = cycles(import_graph(modules()))
    assert found == [], "import cycles (each a set of modules that import each other):\n" + (
        "\n".join(", ".join(m.removeprefix(PACKAGE + ".") for m in c) for c in found)
    )


def test_the_graph_sees_function_local_imports_and_skips_type_checking_ones(
    tmp_path: Path,
) -> None:
    """The reader itself: a cycle closed only inside a function is one; one closed only under
    TYPE_CHECKING is not (it never runs)."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nfrom . import d\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\n"
    )
    graph = import_graph(modules(pkg, "p"))
    assert graph["p.b"] == {"p.a"}
    assert graph["p.d"] == set()
    assert cycles(graph) == [["p.a", "p.b"]]


def test_importing_into_a_package_runs_its_init(tmp_path: Path) -> None:
    """`m` imports `k.x`; `k/__init__` imports `k.y`, which imports `m`: a cycle through the
    package's __init__, though no module names `k` itself. Siblings inside `k` importing each
    other are not one (`k` is already being imported when they run)."""
    pkg = tmp_path / "p"
    (pkg / "k").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text("from .k.x import X\n")
    (pkg / "k" / "__init__.py").write_text("from . import x, y\n")
    (pkg / "k" / "x.py").write_text("from .y import Y\n")
    (pkg / "k" / "y.py").write_text("from ..m import M\n")
    graph = import_graph(modules(pkg, "p"))
    assert graph["p.m"] == {"p.k.x", "p.k"}
    assert graph["p.k.x"] == {"p.k.y"}
    assert cycles(graph) == [["p.k", "p.k.x", "p.k.y", "p.m"]]


# Modules of one device family: they live in its package under kinds/, never at the root.
NVIDIA_ONLY = (
    "gpusharing",
    "driverwait",
    "dynamicmig",
    "mignvml",
    "migprofiles",
    "nvidiacdi",
    "xids",
    "seengpus",
)
# The RDMA family's own: NCCL's pod-level environment and the endpoints' holds.
RDMA_ONLY = ("ncclenv", "nccltopo", "nccltopofiles", "holds", "podenv")


def test_the_root_holds_no_family_module() -> None:
    mods = modules()
    at_root = {m.removeprefix(PACKAGE + ".") for m in mods if m.count(".") == 2}
    assert not at_root & {*NVIDIA_ONLY, *RDMA_ONLY}, "family modules at the kubeletplugin root"
    for name in NVIDIA_ONLY:
        assert f"{PACKAGE}.kinds.nvidia.{name}" in mods
    for name in RDMA_ONLY:
        assert f"{PACKAGE}.kinds.rdma.{name}" in mods
    # and the model imports none of a family's at run time
    graph = import_graph(mods)
    assert not {d for d in graph[f"{PACKAGE}.devices"] if ".kinds." in d}


def _vendor_ids() -> set[str]:
    """The ids vendors.py defines (module-level string constants of the `0x` form)."""
    tree = ast.parse(VENDORS.read_text())
    ids = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, str) and value.startswith("0x") and len(value) == 6:
                ids.add(value)
    return ids


def spelled_vendor_ids(path: Path, ids: set[str]) -> list[str]:
    """Where `path` spells one of `ids`: a string that is exactly one (with or without `0x`;
    prose in a docstring may name one) or a hex number literal."""
    bare = {i.removeprefix("0x") for i in ids}
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue  # an f-string part
            if isinstance(value, str) and value.strip().lower() in ids | bare:
                out.append(f"{path.name}:{tok.start[0]} {tok.string}")
        elif tok.type == tokenize.NUMBER and tok.string.lower() in ids:
            out.append(f"{path.name}:{tok.start[0]} {tok.string}")
    return out


def test_vendors_module_defines_the_known_vendors() -> None:
    ids = _vendor_ids()
    # NVIDIA, AMD, Intel, Habana, Huawei, Tenstorrent, Mellanox, Amazon.
    assert {"0x10de", "0x1002", "0x8086", "0x1da3", "0x15b3", "0x1d0f"} <= ids


@pytest.mark.parametrize("root", [ROOT, *PRODUCT], ids=lambda p: p.name)
def test_pci_vendor_ids_are_defined_only_in_vendors_module(root: Path) -> None:
    ids = _vendor_ids()
    found = [
        hit
        for path in sorted(root.rglob("*.py"))
        if path != VENDORS
        for hit in spelled_vendor_ids(path, ids)
    ]
    assert found == [], "PCI vendor ids outside discovery/vendors.py:\n" + "\n".join(found)


def test_the_vendor_scan_finds_a_second_definition(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""Vendor 0x10de in prose is fine."""\nA = "0x10de"\nB = 0x1002\nC = "15b3"\n')
    hits = spelled_vendor_ids(f, {"0x10de", "0x1002", "0x15b3"})
    assert [h.split()[0] for h in hits] == ["m.py:2", "m.py:3", "m.py:4"]


# The composition's core: it holds families (families.py builds them) and calls their hooks
# through `kinds` (the registry and protocols) only; a family's own modules, and the kind
# modules of one vendor, are not its to import (issue 31).
FAMILY_FREE = ("agent", "devices", "prepare")
FAMILY_PACKAGES = ("nvidia", "gaudi", "rdma")
KIND_MODULES = ("nvidia_gpu", "nvidia_mig", "amd_gpu", "efa", "rdma")


def family_imports(graph: dict[str, set[str]], module: str) -> set[str]:
    kinds = f"{PACKAGE}.kinds."
    out = set()
    for dep in graph[f"{PACKAGE}.{module}"]:
        rest = dep.removeprefix(kinds)
        if dep.startswith(kinds) and rest.split(".")[0] in (*FAMILY_PACKAGES, *KIND_MODULES):
            out.add(dep.removeprefix(PACKAGE + "."))
        if module == "devices" and dep.endswith(".discovery.nvml"):  # no NVML type either
            out.add(dep.removeprefix(PACKAGE + "."))
    return out


@pytest.mark.parametrize("module", FAMILY_FREE)
def test_the_core_imports_no_family_module(module: str) -> None:
    found = family_imports(import_graph(modules()), module)
    assert found == set(), f"{module}.py imports family modules at run time: {sorted(found)}"


def test_the_family_rule_sees_a_family_import() -> None:
    graph = {f"{PACKAGE}.agent": {f"{PACKAGE}.kinds.nvidia.xids", f"{PACKAGE}.kinds"}}
    assert family_imports(graph, "agent") == {"kinds.nvidia.xids"}
    # prepare reaches NCCL's pod-level environment through `kinds` (kinds.pod_envs) only
    graph = {f"{PACKAGE}.prepare": {f"{PACKAGE}.kinds.rdma.ncclenv", f"{PACKAGE}.kinds"}}
    assert family_imports(graph, "prepare") == {"kinds.rdma.ncclenv"}


def test_the_agent_stays_under_600_lines() -> None:
    lines = len((ROOT / "agent.py").read_text().splitlines())
    assert lines < 600, f"agent.py has {lines} lines: move a concept into its own module"
