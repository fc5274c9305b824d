"""`fabricdra wait-for-driver` (issue 30 point 3): the node pod's init container waits until
NVML is under the driver root — a distribution's layout or GKE's (no `usr`) — and not at all
on a node without an NVIDIA GPU (kernel-shaped sysfs trees, real files)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fabricdra.cli import main
from fabricdra.kubeletplugin.kinds.nvidia.driverwait import find_nvml, nvidia_gpus, wait_for_driver
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import amd_mi300x, hgx_h100


def _hgx(tmp_path: Path) -> Path:
    b = SysfsBuilder(tmp_path / "sys")
    hgx_h100(b)
    return b.root


def test_nvidia_gpus_are_found_by_vendor_and_display_class(tmp_path: Path) -> None:
    assert len(nvidia_gpus(_hgx(tmp_path))) == 8  # the NICs (15b3) and bridges are not GPUs
    amd = SysfsBuilder(tmp_path / "amd")
    amd_mi300x(amd)
    assert nvidia_gpus(amd.root) == []


@pytest.mark.parametrize(
    "lib", ["usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64"]
)
def test_nvml_is_found_in_each_layout(tmp_path: Path, lib: str) -> None:
    root = tmp_path / "driver"
    assert find_nvml(root) is None
    (root / lib).mkdir(parents=True)
    (root / lib / "libnvidia-ml.so.1").write_text("")
    assert find_nvml(root) == root / lib / "libnvidia-ml.so.1"


def test_it_waits_saying_why_until_the_driver_is_mounted(tmp_path: Path) -> None:
    sysfs, root = _hgx(tmp_path), tmp_path / "run/nvidia/driver"
    said: list[str] = []
    looked = threading.Event()

    def say(text: str) -> None:
        said.append(text)
        looked.set()

    found: list[Path | None] = []
    stop = threading.Event()
    t = threading.Thread(
        target=lambda: found.append(
            wait_for_driver(sysfs, root, "/run/nvidia/driver", interval=0.05, stop=stop, say=say)
        )
    )
    t.start()
    try:
        assert looked.wait(30)
        assert "waiting for the NVIDIA driver of 8 GPU(s)" in said[0]
        assert "driverRoot /run/nvidia/driver" in said[0]
        (root / "usr/lib64").mkdir(parents=True)
        (root / "usr/lib64/libnvidia-ml.so.1").write_text("")
        t.join(30)
    finally:
        stop.set()
        t.join(30)
    assert found == [root / "usr/lib64/libnvidia-ml.so.1"]
    assert said[-1].startswith("NVIDIA driver found")


def test_a_node_without_nvidia_gpus_does_not_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    amd = SysfsBuilder(tmp_path / "amd")
    amd_mi300x(amd)
    argv = ["wait-for-driver", f"--sysfs-root={amd.root}", f"--driver-root={tmp_path / 'none'}"]
    assert main(argv) == 0
    assert "no NVIDIA GPU on this node" in capsys.readouterr().out


def test_bad_flags_are_refused_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wait-for-driver", f"--sysfs-root={tmp_path}", "--driver-root=/x"]) == 2
    assert "has no bus/pci/devices" in capsys.readouterr().err
    assert main(["wait-for-driver", f"--sysfs-root={_hgx(tmp_path)}"]) == 2
    assert "--driver-root" in capsys.readouterr().err
