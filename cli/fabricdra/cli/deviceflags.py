"""The flags that change which devices a node offers, shared by `fabricdra kubelet-plugin` (what
it publishes) and `fabricdra inventory --node-name` (its preview of that), so the preview is
of the same devices (issue 31 point 4). Each has its `FABRICDRA_<FLAG>` environment variable,
as every kubelet-plugin flag (docs/kubelet-plugin.md)."""

from __future__ import annotations

import argparse
from typing import Any

from fabricdra.cli.common import UsageError, env_bool, env_choice, env_int
from fabricdra.cli.common import env as _env


def add_device_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a(
        "--rdma-mode",
        default=env_choice("RDMA_MODE", "exclusive", ["exclusive", "shared", "off"]),
        choices=["exclusive", "shared", "off"],
        help="how whole-function RDMA endpoints are offered where the node has no "
        "fabricdra.io/rdma-mode label [FABRICDRA_RDMA_MODE]",
    )
    a(
        "--rdma-override",
        action="append",
        metavar="MATCH=MODE",
        default=[o for o in (_env("RDMA_OVERRIDES", "") or "").split(",") if o],
        help="one NIC's RDMA mode, beating the node's: MATCH a PCI address or netdev name of a "
        "PF or VF, MODE exclusive|shared|off; repeatable [FABRICDRA_RDMA_OVERRIDES, "
        "comma-separated]",
    )
    a(
        "--rdma-vfs",
        default=env_choice("RDMA_VFS", "true", ["true", "false"]),
        choices=["true", "false"],
        help="offer SR-IOV virtual functions (default true) [FABRICDRA_RDMA_VFS]",
    )
    a(
        "--rdma-shared-holders",
        type=int,
        default=env_int("RDMA_SHARED_HOLDERS", 64),
        help="holders per endpoint in shared mode (default 64) [FABRICDRA_RDMA_SHARED_HOLDERS]",
    )
    a(
        "--efa",
        action="store_true",
        default=env_bool("EFA", False),
        help="also offer AWS EFA functions (type efa); off by default, as AWS nodes advertise "
        "them through their own device plugin [FABRICDRA_EFA=true]",
    )
    a(
        "--efa-device-rdma",
        action="store_true",
        default=env_bool("EFA_DEVICE_RDMA", False),
        help="claims of EFA devices get FI_EFA_USE_DEVICE_RDMA=1: this node's EFA does RDMA "
        "read (p4d, p5); off: libfabric decides [FABRICDRA_EFA_DEVICE_RDMA=true]",
    )
    a(
        "--gaudi",
        action="store_true",
        default=env_bool("GAUDI", False),
        help="also offer Intel Gaudi accelerators (type gaudi); off by default, as Gaudi nodes "
        "advertise them through Habana's device plugin [FABRICDRA_GAUDI=true]",
    )
    a(
        "--dynamic-mig",
        action="store_true",
        default=env_bool("DYNAMIC_MIG", False),
        help="offer each MIG-mode H100/H200 whole and as every MIG profile placement, sharing "
        "one counter set (Kubernetes 1.36+; ignored with a log line on 1.34/1.35); off by "
        "default until proven on hardware [FABRICDRA_DYNAMIC_MIG=true]",
    )
    a(
        "--gpu-shares",
        type=int,
        default=env_int("GPU_SHARES", 0),
        help="offer each whole NVIDIA GPU to up to N claims at once, with consumable memory "
        "and shares (Kubernetes 1.36+; a claim asking no memory takes the whole GPU); 0: "
        "one claim per GPU (default) [FABRICDRA_GPU_SHARES]",
    )
    a(
        "--gpus",
        default=env_choice("GPUS", "true", ["true", "false"]),
        choices=["true", "false"],
        help="offer GPUs and MIG devices; false beside NVIDIA's GPU driver (default true) "
        "[FABRICDRA_GPUS]",
    )
    a(
        "--rdma",
        default=env_choice("RDMA", "true", ["true", "false"]),
        choices=["true", "false"],
        help="offer RDMA endpoints (default true) [FABRICDRA_RDMA]",
    )


def device_config(args: argparse.Namespace) -> Any:
    """The `DeviceConfig` the flags say; a UsageError naming what is wrong."""
    from fabricdra.kubeletplugin.devices import DeviceConfig, parse_override

    try:
        return DeviceConfig(
            args.rdma_mode,
            args.rdma_shared_holders,
            rdma_overrides=tuple(parse_override(o) for o in args.rdma_override),
            rdma_vfs=args.rdma_vfs == "true",
            efa=args.efa,
            efa_device_rdma=args.efa_device_rdma,
            gaudi=args.gaudi,
            dynamic_mig=args.dynamic_mig,
            gpu_shares=args.gpu_shares,
            offer_gpus=args.gpus == "true",
            offer_rdma=args.rdma == "true",
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
