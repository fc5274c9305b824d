"""Safe reads: every path resolved under the root, one attribute capped at 64 KiB, and
"absent" told apart from "unreadable".

Each test runs twice: through the kernel-confined fast path (openat2 RESOLVE_BENEATH) and
through the component-wise walker, which must answer identically."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fabricdra.kubeletplugin.discovery.sysfs import (
    READ_CAP,
    Absent,
    RootError,
    SysfsTree,
    Unreadable,
)
from tests.sysfs.builder import SysfsBuilder

MakeTree = Callable[[Path], SysfsTree]


@pytest.fixture(params=["kernel-confined", "walker"])
def make_tree(request: pytest.FixtureRequest) -> Iterator[MakeTree]:
    trees: list[SysfsTree] = []

    def make(root: Path) -> SysfsTree:
        if request.param == "walker":
            tree = SysfsTree(root, kernel_confined=False)
        else:
            tree = SysfsTree(root)
        trees.append(tree)
        return tree

    yield make
    for t in trees:
        t.close()


@pytest.fixture
def b(tmp_path: Path) -> SysfsBuilder:
    b = SysfsBuilder(tmp_path / "sys")
    rb = b.root_bus("pci0000:15")
    nic = b.nic(b.bridge(rb, "0000:15:01.0", 0), "0000:16:00.0", "ens1np0", numa=0)
    b.write(f"{nic}/padded", "  42 \n\n")
    b.write(f"{nic}/hex", "0x1003")
    b.write(f"{nic}/words", "not a number")
    return b


NIC = "devices/pci0000:15/0000:15:01.0/0000:16:00.0"


def test_reads_an_attribute_through_the_symlink_chain(b: SysfsBuilder, make_tree: MakeTree) -> None:
    tree = make_tree(b.root)
    assert tree.read("class/net/ens1np0/mtu") == "9000"
    assert tree.read("class/net/ens1np0/device/numa_node") == "0"
    assert tree.read("bus/pci/devices/0000:16:00.0/padded") == "42"  # whitespace stripped


def test_resolve_returns_the_real_path_relative_to_the_root(
    b: SysfsBuilder, make_tree: MakeTree
) -> None:
    tree = make_tree(b.root)
    assert tree.resolve("class/net/ens1np0/device") == NIC
    assert tree.resolve("bus/pci/devices/0000:16:00.0") == NIC
    assert tree.resolve("") == ""
    assert tree.link_name(f"{NIC}/subsystem") == "pci"
    assert tree.link_name(f"{NIC}/driver") == "mlx5_core"


def test_a_missing_file_is_absent_not_unreadable(b: SysfsBuilder, make_tree: MakeTree) -> None:
    tree = make_tree(b.root)
    for rel in (
        f"{NIC}/no_such_attribute",
        "class/net/nope/mtu",  # missing directory on the way
        f"{NIC}/vendor/below_a_file",  # a file used as a directory (ENOTDIR)
    ):
        got = tree.read(rel)
        assert isinstance(got, Absent), rel
    assert isinstance(tree.resolve("class/infiniband"), Absent)
    assert isinstance(tree.listdir("class/infiniband"), Absent)
    assert tree.exists("class/net")
    assert not tree.exists("class/infiniband")


def test_a_directory_where_an_attribute_should_be_is_unreadable(
    b: SysfsBuilder, make_tree: MakeTree
) -> None:
    b.make_unreadable(f"{NIC}/numa_node", "directory")
    got = make_tree(b.root).read(f"{NIC}/numa_node")
    assert isinstance(got, Unreadable)


@pytest.mark.parametrize("target", ["/etc", "/proc/version", "../../../../../../../etc/hostname"])
def test_a_link_escaping_the_root_is_refused(
    b: SysfsBuilder, make_tree: MakeTree, target: str
) -> None:
    b.escape(f"{NIC}/numa_node", target)
    b.escape("class/infiniband", target)
    tree = make_tree(b.root)
    assert isinstance(tree.read(f"{NIC}/numa_node"), Unreadable)
    assert isinstance(tree.resolve("class/infiniband"), Unreadable)
    assert isinstance(tree.listdir("class/infiniband"), Unreadable)
    assert isinstance(tree.read("class/infiniband/hostname"), Unreadable)
    assert not tree.exists("class/infiniband")


def test_an_escape_in_the_middle_of_a_chain_is_refused(
    b: SysfsBuilder, make_tree: MakeTree, tmp_path: Path
) -> None:
    # A link inside the tree to a directory outside it, which holds a link back inside: the
    # chain lands inside, but it went through a place outside the root.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mtu").write_text("1500\n")
    os.symlink(outside, b.root / "class/net/sneaky")
    tree = make_tree(b.root)
    assert isinstance(tree.read("class/net/sneaky/mtu"), Unreadable)


def test_dotdot_above_the_root_is_refused(b: SysfsBuilder, make_tree: MakeTree) -> None:
    (b.root.parent / "secret").write_text("x\n")
    tree = make_tree(b.root)
    assert isinstance(tree.read("../secret"), Unreadable)
    assert isinstance(tree.read("class/../../secret"), Unreadable)


def test_an_absolute_link_back_into_the_root_is_followed(
    b: SysfsBuilder, make_tree: MakeTree
) -> None:
    os.symlink(b.root / NIC, b.root / "class/net/absolute")
    tree = make_tree(b.root)
    assert tree.read("class/net/absolute/numa_node") == "0"
    assert tree.resolve("class/net/absolute") == NIC


def test_a_link_loop_is_unreadable(b: SysfsBuilder, make_tree: MakeTree) -> None:
    b.make_unreadable(f"{NIC}/numa_node", "link-loop")
    os.symlink("loop-b", b.root / "class/loop-a")
    os.symlink("loop-a", b.root / "class/loop-b")
    tree = make_tree(b.root)
    assert isinstance(tree.read(f"{NIC}/numa_node"), Unreadable)
    assert isinstance(tree.resolve("class/loop-a"), Unreadable)


def test_the_cap_is_64_kib(b: SysfsBuilder, make_tree: MakeTree) -> None:
    assert READ_CAP == 64 * 1024
    b.write("at_cap", b"x" * READ_CAP)
    b.write("over_cap", b"x" * (READ_CAP + 1))
    b.write("one_mib", b"4: ACTIVE\n" * (1024 * 1024 // 10))
    tree = make_tree(b.root)
    assert tree.read("at_cap") == "x" * READ_CAP
    for rel in ("over_cap", "one_mib"):
        got = tree.read(rel)
        # Refused whole, never truncated: half an attribute is not a reading.
        assert isinstance(got, Unreadable), rel
        assert "64 KiB" in got.reason


def test_read_int(b: SysfsBuilder, make_tree: MakeTree) -> None:
    tree = make_tree(b.root)
    assert tree.read_int(f"{NIC}/padded") == 42
    assert tree.read_int(f"{NIC}/hex", 16) == 0x1003
    assert isinstance(tree.read_int(f"{NIC}/words"), Unreadable)
    assert isinstance(tree.read_int(f"{NIC}/missing"), Absent)


def test_listdir_is_sorted(b: SysfsBuilder, make_tree: MakeTree) -> None:
    for name in ("zz0", "aa0", "mm0"):
        b.netdev(name, None)
    assert make_tree(b.root).listdir("class/net") == ["aa0", "ens1np0", "mm0", "zz0"]


def test_the_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(RootError, match="does not exist"):
        SysfsTree(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RootError, match="not a directory"):
        SysfsTree(tmp_path / "file")


def test_failures_name_the_path(b: SysfsBuilder, make_tree: MakeTree) -> None:
    b.make_unreadable(f"{NIC}/numa_node", "oversize")
    tree = make_tree(b.root)
    assert "numa_node" in str(tree.read(f"{NIC}/numa_node"))
    assert "nope" in str(tree.read("class/net/nope/mtu"))


def test_a_fifo_does_not_block_the_reader(b: SysfsBuilder, make_tree: MakeTree) -> None:
    fifo = b.root / "fifo"
    os.mkfifo(fifo)
    tree = make_tree(b.root)
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(tree.read("fifo")), daemon=True)
    reader.start()
    reader.join(2)
    blocked = reader.is_alive()
    if blocked:
        # Release the reader: a writer that opens and closes gives it end-of-file.
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not blocked
    assert isinstance(result[0], Unreadable)


def test_a_device_node_is_not_an_attribute(b: SysfsBuilder, make_tree: MakeTree) -> None:
    os.mknod(b.root / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # like /dev/zero
    assert isinstance(make_tree(b.root).read("zero"), Unreadable)


def test_a_file_where_a_directory_should_be_is_unreadable(
    b: SysfsBuilder, make_tree: MakeTree
) -> None:
    b.write("class/infiniband", "not a directory")
    assert isinstance(make_tree(b.root).listdir("class/infiniband"), Unreadable)


def test_a_missing_directory_under_a_file_is_absent(b: SysfsBuilder, make_tree: MakeTree) -> None:
    b.write("class/infiniband", "not a directory")
    assert isinstance(make_tree(b.root).listdir("class/infiniband/mlx5_0"), Absent)
