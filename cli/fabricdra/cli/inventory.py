"""`fabricdra inventory` and `fabricdra nvml-snapshot`."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.discovery.node import Discovery, NvmlSource, discover
from fabricdra.kubeletplugin.discovery.nvml import (
    SnapshotError,
    dump_snapshot,
    load_snapshot,
    read_live,
    record_xid_events,
)
from fabricdra.kubeletplugin.discovery.sysfs import RootError, SysfsTree
from fabricdra.kubeletplugin.report import PreviousError, inventory_document, load_previous

from . import logs
from .common import UsageError, print_json

log = logs.get_logger("fabricdra.inventory")


def register(sub: Any) -> None:
    add_inventory(sub)
    add_nvml_snapshot(sub)


def add_inventory(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "inventory",
        help="print this node's interfaces, accelerators and labels as JSON",
        description="Read the node from sysfs (and NVML) and print one JSON document: "
        "interfaces, accelerators and the desired fabricdra.io/ node labels.",
    )
    p.add_argument("--sysfs-root", default="/sys", help="root of the sysfs tree (default /sys)")
    p.add_argument(
        "--nvml-snapshot",
        metavar="FILE",
        help="read recorded NVML answers (from `fabricdra nvml-snapshot`) instead of the library",
    )
    p.add_argument(
        "--previous",
        metavar="FILE",
        help="an earlier output: keeps first-seen failure times and the record of a part "
        "whose enumeration fails",
    )
    p.add_argument(
        "--node-name",
        metavar="NAME",
        help="also print `resourceSlices`: the ResourceSlices the kubelet plugin would publish "
        "for this node under that name (default plugin settings; pool generation 0)",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="report the bundled sample node (8 GPUs, RDMA NICs) instead of this machine",
    )
    p.set_defaults(run=run_inventory)


def add_nvml_snapshot(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "nvml-snapshot",
        help="record this host's NVML answers as JSON, for --nvml-snapshot elsewhere",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument(
        "--xid-events-seconds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also record the Xid events that arrive within this time (default 0: record only "
        "whether each GPU accepts Xid event registration)",
    )
    p.set_defaults(run=run_nvml_snapshot)


def run_inventory(args: argparse.Namespace) -> int:

    with ExitStack() as stack:
        root, snapshot = args.sysfs_root, args.nvml_snapshot
        if args.sample:
            # Only here: unpacking imports tarfile, zipfile and tempfile (bench/startup.py).
            from fabricdra.kubeletplugin.samples import sample_node

            sample_root, sample_snapshot = stack.enter_context(sample_node())
            root, snapshot = str(sample_root), snapshot or str(sample_snapshot)
        try:
            tree = SysfsTree(root)
            nvml_source: NvmlSource = read_live
            if snapshot is not None:
                readings = load_snapshot(snapshot)
                nvml_source = lambda: readings  # noqa: E731
            previous = load_previous(args.previous) if args.previous else None
        except (RootError, SnapshotError, PreviousError) as e:
            raise UsageError(str(e)) from e

        result = discover(tree, nvml_source=nvml_source, previous=previous)
        for part, message in result.failures.items():
            log.error("enumeration failed; keeping the previous record", part=part, error=message)
        if result.nvml is not None and not result.nvml.available:
            log.warning("NVML unavailable; NVIDIA details omitted", reason=result.nvml.reason)
        for key, value in result.labels.rejected.items():
            log.warning("label withheld: not a valid label value", key=key, value=value)
        doc = inventory_document(result, "sample" if args.sample else root)
        if args.node_name:
            doc["resourceSlices"] = _resource_slices(result, args.node_name, snapshot)
        print_json(doc)
    return 0


def _resource_slices(
    result: Discovery, node_name: str, snapshot: str | None
) -> list[dict[str, Any]]:
    """Exactly what NodePublisher would publish for this discovery (same builders, same
    health rules, Xid events as the agent's first pass sees them: a snapshot's recorded ones,
    or on a GPU host whether each GPU can report them), so a node's slices can be inspected
    without a cluster."""
    from fabricdra.kubeletplugin.devices import build_devices, gpu_info
    from fabricdra.kubeletplugin.discovery.nvml import (
        LiveXidEvents,
        ReplayedXidEvents,
        XidEventSource,
    )
    from fabricdra.kubeletplugin.health import gpu_health, nvidia_bound
    from fabricdra.kubeletplugin.resourceslices import build_slices
    from fabricdra.kubeletplugin.xids import XidWatch

    source: XidEventSource = ReplayedXidEvents(snapshot) if snapshot else LiveXidEvents()
    watch = XidWatch(source)
    try:
        nvml = watch.apply(result.nvml)
    finally:
        watch.close()
    inventory = build_devices(
        result.interfaces or [],
        result.accelerators or [],
        gpu_health=gpu_health(
            nvml, None, expected=nvidia_bound(result.accelerators), amd=result.amd
        ),
        gpu_info=gpu_info(nvml),
    )
    plan = build_slices(inventory, node_name)
    for device, omitted in plan.omitted.items():
        log.warning("attributes omitted: over the API's limits", device=device, omitted=omitted)
    return plan.slices


def run_nvml_snapshot(args: argparse.Namespace) -> int:
    if not args.xid_events_seconds >= 0:
        raise UsageError(f"--xid-events-seconds must be 0 or more, not {args.xid_events_seconds}")
    readings = read_live()
    if not readings.available:
        print(f"fabricdra nvml-snapshot: NVML unavailable: {readings.reason}", file=sys.stderr)
        return 1
    readings = record_xid_events(readings, args.xid_events_seconds)
    for bus, error in readings.errors.items():
        log.error("GPU not recorded", pciBusId=bus, error=error)
    text = dump_snapshot(readings)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from e
    else:
        sys.stdout.write(text)
    return 0
