"""Stand-in IMEX executables for tests (see nvidia-imex / nvidia-imex-ctl here), and a driver
install laid out as NVIDIA's driver lays it out, for what an IMEX daemon is given."""

from __future__ import annotations

import os
import stat
from pathlib import Path

NVRM_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  "
    "Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue May 13 04:35:37 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
NVRM_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Thu Oct 10 12:29:05 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)


def driver_tree(tmp_path: Path, version: str = "570.158.01") -> tuple[Path, Path, Path]:
    """A driver root (as the GPU operator mounts it), /proc and /dev as the driver lays them
    out: IMEX executables, libraries of the loaded version with their soname links (and one
    left over from an older driver), the control device and the fabric capability."""
    root = tmp_path / "run-nvidia-driver"
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("nvidia-imex", "nvidia-imex-ctl"):
        (root / "usr" / "bin" / name).write_text("#!/bin/sh\n")
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnvidia-ml", "libcuda", "libnvidia-nvvm"):
        (lib / f"{name}.so.{version}").write_bytes(b"\x7fELF")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{version}")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")  # the dev link: not what programs load
    (lib / "libnvidia-ml.so.550.54.15").write_bytes(b"\x7fELF")  # another driver's
    (lib / "libz.so.1").write_bytes(b"\x7fELF")  # not the driver's
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia" / "capabilities").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "capabilities" / "fabric-imex-mgmt").write_text(
        "DeviceFileMinor: 7\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    )
    (proc / "driver" / "nvidia" / "version").write_text(NVRM_OPEN.replace("570.158.01", version))
    (proc / "devices").write_text("Character devices:\n195 nvidia\n238 nvidia-caps\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    return root, proc, dev
