"""Wait for the NVIDIA driver under the driver root before the node plugins start (the node
DaemonSet's `wait-for-driver` init container, `fabricdra wait-for-driver`).

The GPU Operator's driver container mounts the driver's root file system at its driver root
(`/run/nvidia/driver`) once the kernel module is loaded, and again each time the container is
replaced (a driver upgrade). The chart mounts the *parent* of the driver root with
`mountPropagation: HostToContainer`, so each new mount shows up in the pod; this waits until
NVML (`libnvidia-ml.so.1`) is there. Layouts: a distribution's (`usr/lib/<triplet>`,
`usr/lib64`, `usr/lib`) and GKE's, which has no `usr` (`lib64`, with `bin`). A node without
an NVIDIA GPU (PCI vendor 0x10de, display class 0x03xx) waits for nothing: its RDMA NICs and
AMD GPUs need no NVIDIA driver."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from ...discovery.vendors import NVIDIA

NVML = "libnvidia-ml.so.1"
# Where a driver root keeps NVML: distributions' folders first, then GKE's (no `usr`).
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib",
)


def nvidia_gpus(sysfs_root: Path) -> list[str]:
    """The PCI addresses of this host's NVIDIA GPUs (display class), from sysfs."""
    devices = sysfs_root / "bus" / "pci" / "devices"
    out = []
    for entry in sorted(os.listdir(devices)):
        try:
            vendor = (devices / entry / "vendor").read_text().strip()
            klass = (devices / entry / "class").read_text().strip()
        except OSError:
            continue  # gone meanwhile (hot unplug): not a GPU to wait for
        if vendor == NVIDIA and klass.startswith("0x03"):
            out.append(entry)
    return out


def find_nvml(driver_root: Path) -> Path | None:
    for d in LIB_DIRS:
        path = driver_root / d / NVML
        if path.exists():
            return path
    return None


def wait_for_driver(
    sysfs_root: Path,
    driver_root: Path,
    host_driver_root: str,
    *,
    interval: float = 10.0,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = print,
) -> Path | None:
    """Returns once NVML is under `driver_root` (its path) or the node has no NVIDIA GPU
    (None); `stop` set ends the wait too (None). Says what it waits for every `interval`."""
    stop = stop or threading.Event()
    gpus = nvidia_gpus(sysfs_root)
    if not gpus:
        say("no NVIDIA GPU on this node: not waiting for the NVIDIA driver")
        return None
    while True:
        found = find_nvml(driver_root)
        if found is not None:
            say(f"NVIDIA driver found: {found}")
            return found
        say(
            f"waiting for the NVIDIA driver of {len(gpus)} GPU(s): no {NVML} under "
            f"driverRoot {host_driver_root} ({', '.join(LIB_DIRS)}); the GPU Operator's "
            "driver container mounts it there once the driver is loaded — or set driverRoot "
            "to where the host's driver is installed (docs/install.md, 'The NVIDIA driver')"
        )
        if stop.wait(interval):
            return None
