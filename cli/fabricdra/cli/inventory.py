"""`fabricdra inventory` and `fabricdra nvml-snapshot`."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fabricdra.api.inventory import Interface, Neighbour
from fabricdra.api.scaleout import TopologyFileError, parse_topology_file
from fabricdra.kubeletplugin.discovery.node import Discovery, NvmlSource, discover
from fabricdra.kubeletplugin.discovery.nvml import (
    SnapshotError,
    dump_snapshot,
    load_snapshot,
    read_live,
    record_xid_events,
)
from fabricdra.kubeletplugin.discovery.scaleout import lldpd
from fabricdra.kubeletplugin.discovery.scaleout.annotate import (
    ScaleOutInputs,
    parse_role_override,
)
from fabricdra.kubeletplugin.discovery.sysfs import RootError, SysfsTree
from fabricdra.kubeletplugin.report import PreviousError, inventory_document, load_previous

from . import logs
from .common import UsageError, print_json
from .deviceflags import add_device_flags, device_config

if TYPE_CHECKING:
    from fabricdra.kubeletplugin.devices import DeviceConfig

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
        "for this node under that name, with the device flags below (pool generation 0)",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="report the bundled sample node (8 GPUs, RDMA NICs) instead of this machine",
    )
    p.add_argument(
        "--topology-file",
        metavar="PATH",
        help="the declared scale-out topology (Slurm topology.conf tree form or the YAML of "
        "docs/scale-out.md); the node is --node-name, else this host's name",
    )
    p.add_argument(
        "--lldpd-json",
        metavar="FILE",
        help="a recorded `lldpcli -f json0 show neighbors` as the RoCE NICs' measured LLDP "
        "neighbours (inventory reads no live neighbour source: it does not wait for LLDPDUs)",
    )
    p.add_argument(
        "--net-role",
        action="append",
        default=[],
        metavar="MATCH=ROLE",
        help="one NIC's netRole (PCI address, netdev or RDMA device = compute|storage|frontend); "
        "repeatable",
    )
    # The kubelet plugin's flags that change what it offers (and their FABRICDRA_ variables),
    # so the preview is of the devices the agent would publish on this node.
    add_device_flags(p)
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
    config = device_config(args)  # bad flags fail before the node is read
    # So do the operator's own scale-out inputs: read before a sample is unpacked.
    scaleout = _scale_out_inputs(args.topology_file, args.lldpd_json, args.net_role)
    with ExitStack() as stack:
        root, snapshot = args.sysfs_root, args.nvml_snapshot
        # os.uname().nodename is gethostname(2)'s answer on Linux, without importing socket.
        node = args.node_name or os.uname().nodename
        if args.sample:
            # Only here: unpacking imports tarfile, zipfile and tempfile (bench/startup.py).
            from fabricdra.kubeletplugin.samples import (
                SAMPLE_LLDPD,
                SAMPLE_NODE,
                SAMPLE_TOPOLOGY,
                sample_node,
            )

            sample_root, sample_snapshot = stack.enter_context(sample_node())
            root, snapshot = str(sample_root), snapshot or str(sample_snapshot)
            node = args.node_name or SAMPLE_NODE
            # The sample's own topology file and lldpd answers, where no flag named one.
            here = os.path.dirname(root)
            sample = _scale_out_inputs(
                None if args.topology_file else os.path.join(here, SAMPLE_TOPOLOGY),
                None if args.lldpd_json else os.path.join(here, SAMPLE_LLDPD),
                [],
            )
            scaleout = replace(
                scaleout,
                declared=scaleout.declared if args.topology_file else sample.declared,
                neighbours=scaleout.neighbours if args.lldpd_json else sample.neighbours,
            )
        scaleout = replace(scaleout, node=node)
        try:
            tree = SysfsTree(root)
            nvml_source: NvmlSource = read_live
            if snapshot is not None:
                readings = load_snapshot(snapshot)
                nvml_source = lambda: readings  # noqa: E731
            previous = load_previous(args.previous) if args.previous else None
        except (RootError, SnapshotError, PreviousError) as e:
            raise UsageError(str(e)) from e

        result = discover(tree, nvml_source=nvml_source, previous=previous, scaleout=scaleout)
        for part, message in result.failures.items():
            log.error("enumeration failed; keeping the previous record", part=part, error=message)
        if result.nvml is not None and not result.nvml.available:
            log.warning("NVML unavailable; NVIDIA details omitted", reason=result.nvml.reason)
        for key, value in result.labels.rejected.items():
            log.warning("label withheld: not a valid label value", key=key, value=value)
        doc = inventory_document(result, "sample" if args.sample else root)
        if args.node_name:
            doc["resourceSlices"] = _resource_slices(result, tree, config, args.node_name, snapshot)
        print_json(doc)
    return 0


def _scale_out_inputs(
    topology: str | None, lldp_json: str | None, roles: list[str]
) -> ScaleOutInputs:
    """The scale-out inputs the files and flags give, for a node named later."""
    try:
        overrides = tuple(parse_role_override(r) for r in roles)
    except ValueError as e:
        raise UsageError(str(e)) from None
    declared = None
    if topology is not None:
        try:
            declared = parse_topology_file(_read(topology))
        except OSError as e:
            raise UsageError(f"cannot read {topology}: {e.strerror or e}") from None
        except TopologyFileError as e:
            raise UsageError(f"{topology}: {e}") from None
    source = None
    if lldp_json is not None:
        try:
            heard = lldpd.parse_neighbors(_read(lldp_json))
        except OSError as e:
            raise UsageError(f"cannot read {lldp_json}: {e.strerror or e}") from None
        except lldpd.LldpdError as e:
            raise UsageError(f"{lldp_json}: {e}") from None

        def source(iface: Interface, port: int | None) -> Neighbour | str | None:
            if (iface.linkLayer or "").lower() != "ethernet":
                return None
            return lldpd.reading_for(heard, iface.name)

    return ScaleOutInputs(None, declared, source, overrides)


def _read(path: str) -> str:
    # open, not pathlib: importing pathlib was ~3 % of this command's start-up.
    with open(path) as f:
        return f.read()


def _resource_slices(
    result: Discovery,
    tree: SysfsTree,
    config: DeviceConfig,
    node_name: str,
    snapshot: str | None,
) -> list[dict[str, Any]]:
    """What NodePublisher would publish for this discovery under the node's device `config`:
    the agent's own assembly (`assembly.assemble`) and builders, its health rules, Xid events
    as its first pass sees them (a snapshot's recorded ones, or on a GPU host whether each
    GPU can report them), so a node's slices can be inspected without a cluster."""
    from fabricdra.kubeletplugin.assembly import assemble
    from fabricdra.kubeletplugin.discovery.nvml import (
        LiveXidEvents,
        ReplayedXidEvents,
        XidEventSource,
    )
    from fabricdra.kubeletplugin.health import gpu_health, nvidia_bound
    from fabricdra.kubeletplugin.kinds.nvidia.xids import XidWatch
    from fabricdra.kubeletplugin.resourceslices import build_slices

    source: XidEventSource = ReplayedXidEvents(snapshot) if snapshot else LiveXidEvents()
    watch = XidWatch(source)
    try:
        nvml = watch.apply(result.nvml)
    finally:
        watch.close()
    health = gpu_health(nvml, None, expected=nvidia_bound(result.accelerators), amd=result.amd)
    inventory = assemble(result, config, tree, nvml=nvml, gpu_health=health)
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
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from e
    else:
        sys.stdout.write(text)
    return 0
