"""`fabricdra wait-for-driver`: the node DaemonSet's init container; returns once the NVIDIA
driver's NVML is under the driver root, at once on a node without an NVIDIA GPU
(kubeletplugin/fabricdra/kubeletplugin/driverwait.py). Documented in docs/cli.md."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fabricdra.cli.common import UsageError, env_float
from fabricdra.cli.common import env as _env


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "wait-for-driver",
        help="wait until the NVIDIA driver is under the driver root (node pods' init container)",
        description="Return once libnvidia-ml.so.1 is under the driver root (usr/lib/<triplet>, "
        "usr/lib64, usr/lib, or GKE's lib64, lib), or at once when sysfs shows no NVIDIA GPU. "
        "Says what it waits for every interval. Each flag can also be set by the environment "
        "variable in brackets.",
    )
    a = p.add_argument
    a("--sysfs-root", default=_env("SYSFS_ROOT", "/sys"), help="sysfs root [FABRICDRA_SYSFS_ROOT]")
    a(
        "--driver-root",
        default=_env("DRIVER_ROOT"),
        help="the driver root as this container sees it [FABRICDRA_DRIVER_ROOT]",
    )
    a(
        "--host-driver-root",
        default=_env("HOST_DRIVER_ROOT"),
        help="the driver root on the host, for the messages (default: --driver-root) "
        "[FABRICDRA_HOST_DRIVER_ROOT]",
    )
    a(
        "--interval",
        type=float,
        default=env_float("INTERVAL", 10),
        help="seconds between looks (default 10) [FABRICDRA_INTERVAL]",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fabricdra.kubeletplugin.kinds.nvidia.driverwait import wait_for_driver

    if not args.driver_root:
        raise UsageError("--driver-root (or FABRICDRA_DRIVER_ROOT) is required")
    if args.interval <= 0:
        raise UsageError(f"--interval must be positive, not {args.interval}")
    sysfs = Path(args.sysfs_root)
    if not (sysfs / "bus" / "pci" / "devices").is_dir():
        raise UsageError(f"--sysfs-root {sysfs} has no bus/pci/devices")
    wait_for_driver(
        sysfs,
        Path(args.driver_root),
        args.host_driver_root or args.driver_root,
        interval=args.interval,
        say=lambda text: print(text, flush=True),
    )
    return 0
