"""The two ways SysfsTree resolves paths — the kernel's openat2(RESOLVE_BENEATH) fast path and
the component-wise walker it falls back to — give the same answers, including every refusal."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from fabricdra.kubeletplugin.discovery.beneath import Beneath
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import READ_CAP, Absent, SysfsTree, Unreadable
from fabricdra.kubeletplugin.report import inventory_document
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100

MODES = pytest.mark.parametrize("kernel", [True, False], ids=["openat2", "walker"])


def test_openat2_is_available_here() -> None:
    # The fast path is what runs in production on any kernel >= 5.6; if this machine lost it,
    # the parametrised tests below would silently test the walker twice.
    assert Beneath.create("/") is not None


@pytest.fixture
def tree_root(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    b = SysfsBuilder(root)
    b.write("devices/a/attr", "hello")
    b.write("devices/a/big", b"x" * (1024 * 1024))
    b.write("devices/a/cap", b"y" * READ_CAP)
    (root / "devices/a/dir").mkdir()
    b.link("class/thing/a", "devices/a")
    os.symlink("/etc", root / "devices/a/out")  # absolute, outside
    os.symlink("../../..", root / "devices/a/up")  # climbs above the root
    os.symlink(str(root / "devices/a"), root / "class/thing/abs")  # absolute, but inside
    os.symlink("loop2", root / "devices/a/loop1")
    os.symlink("loop1", root / "devices/a/loop2")
    os.mkfifo(root / "devices/a/fifo")
    (tmp_path / "secret").write_text("outside\n")
    return root


@MODES
def test_reads_through_links(tree_root: Path, kernel: bool) -> None:
    tree = SysfsTree(tree_root, kernel_confined=kernel)
    assert tree.read("class/thing/a/attr") == "hello"
    assert tree.read("class/thing/abs/attr") == "hello"
    assert tree.resolve("class/thing/a") == "devices/a"
    assert tree.resolve("class/thing/abs") == "devices/a"
    assert tree.resolve("") == ""
    assert tree.link_name("class/thing/a") == "a"
    assert tree.listdir("class/thing") == ["a", "abs"]


@MODES
def test_absent_is_not_unreadable(tree_root: Path, kernel: bool) -> None:
    tree = SysfsTree(tree_root, kernel_confined=kernel)
    assert isinstance(tree.read("class/thing/a/missing"), Absent)
    assert isinstance(tree.read("class/nothing/x/attr"), Absent)
    assert isinstance(tree.listdir("class/nothing"), Absent)
    assert isinstance(tree.resolve("class/thing/missing"), Absent)


@MODES
@pytest.mark.parametrize(
    "rel",
    ["devices/a/out/hostname", "devices/a/up/secret", "devices/a/loop1", "devices/a/dir"],
)
def test_refusals_are_unreadable(tree_root: Path, kernel: bool, rel: str) -> None:
    tree = SysfsTree(tree_root, kernel_confined=kernel)
    assert isinstance(tree.read(rel), Unreadable)


@MODES
def test_escaping_link_is_named(tree_root: Path, kernel: bool) -> None:
    tree = SysfsTree(tree_root, kernel_confined=kernel)
    out = tree.resolve("devices/a/out")
    assert isinstance(out, Unreadable)
    assert "outside the sysfs root" in out.reason
    assert isinstance(tree.listdir("devices/a/out"), Unreadable)


@MODES
def test_read_cap(tree_root: Path, kernel: bool) -> None:
    tree = SysfsTree(tree_root, kernel_confined=kernel)
    big = tree.read("devices/a/big")
    assert isinstance(big, Unreadable)
    assert "read cap" in big.reason
    assert tree.read("devices/a/cap") == "y" * READ_CAP  # exactly at the cap is fine


@MODES
def test_fifo_does_not_hang(tree_root: Path, kernel: bool) -> None:
    result: list[object] = []
    reader = threading.Thread(
        target=lambda: result.append(
            SysfsTree(tree_root, kernel_confined=kernel).read("devices/a/fifo")
        ),
        daemon=True,
    )
    reader.start()
    reader.join(timeout=10)
    assert result, "reading a FIFO blocked"
    assert isinstance(result[0], Unreadable)
    assert "not a regular file" in result[0].reason


def test_whole_node_identical_in_both_modes(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    hgx = hgx_h100(SysfsBuilder(root), vf_nics=(6, 7), vfs_per_nic=4)
    snapshot = tmp_path / "nvml.json"
    snapshot.write_text(json.dumps(h100_snapshot(hgx.gpus)))
    readings = load_snapshot(snapshot)
    docs = [
        inventory_document(
            discover(SysfsTree(root, kernel_confined=kernel), nvml_source=lambda: readings),
            "x",
        )
        for kernel in (True, False)
    ]
    assert docs[0] == docs[1]
    assert docs[0]["interfaces"], "the fixture has interfaces"


TRICKY = [
    "",
    "devices",
    "devices/a",
    "devices/a/attr",
    "devices/a/missing",
    "devices/a/missing/deeper",
    "devices/a/attr/under_a_file",
    "class/thing/a",
    "class/thing/a/attr",
    "class/thing/abs",
    "class/thing/abs/attr",
    "class/thing/dangling",
    "class/thing/dotted",
    "class/thing/dotted/attr",
    "class/thing/updir",
    "class/thing/top",
    "class/thing/a/../a/attr",
    "class/thing/a/./attr",
    "devices/a/out",
    "devices/a/out/hostname",
    "devices/a/up",
    "devices/a/up/secret",
    "devices/a/loop1",
    "devices/a/loop1/x",
    "class/../../secret",
]


@pytest.fixture
def tricky_root(tree_root: Path) -> Path:
    thing = tree_root / "class/thing"
    os.symlink("../../devices/a/gone", thing / "dangling")
    os.symlink("../../devices/./a/../a", thing / "dotted")
    os.symlink("../../devices/a/..", thing / "updir")
    os.symlink("../..", thing / "top")
    return tree_root


@pytest.mark.parametrize("parents_first", [False, True], ids=["cold", "parents-cached"])
def test_derived_resolution_matches_the_kernel_and_the_walker(
    tricky_root: Path, parents_first: bool
) -> None:
    # resolve() derives a path from its parent's resolution plus one readlink; whether or not
    # the parents were resolved before, it must give what the kernel's resolution of the whole
    # path and the walker give, refusals included.
    derived = SysfsTree(tricky_root)
    if parents_first:
        for rel in TRICKY:
            parent = rel.rpartition("/")[0]
            derived.resolve(parent)
    for rel in TRICKY:
        kernel = SysfsTree(tricky_root)
        assert kernel._beneath is not None
        walker = SysfsTree(tricky_root, kernel_confined=False)
        expected = kernel._kernel_resolve(rel, kernel._beneath)
        assert derived.resolve(rel) == expected, rel
        assert walker.resolve(rel) == expected, rel
        assert derived.exists(rel) == walker.exists(rel), rel
        kernel.close()


def test_trees_close_their_descriptors(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    hgx = hgx_h100(SysfsBuilder(root), vf_nics=(6,), vfs_per_nic=4)
    snapshot = tmp_path / "nvml.json"
    snapshot.write_text(json.dumps(h100_snapshot(hgx.gpus)))
    readings = load_snapshot(snapshot)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        discover(SysfsTree(root), nvml_source=lambda: readings)
    assert len(os.listdir("/proc/self/fd")) == before
