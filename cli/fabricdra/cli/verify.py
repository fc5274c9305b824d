"""`fabricdra verify`: the verification run as a one-shot (the seed's preflight), and the
manual override of a node's verification gate (docs/verification.md).

    fabricdra verify [--sample | --sysfs-root R --nvml-snapshot F] [--expect FILE]
                     [-o table|json] [--all]
        exit 0: passed; 1: not passed (a probe failed, or a required probe did not run)
    fabricdra verify --node NODE [--kubeconfig K]      ask NODE's agent to verify again
    fabricdra verify --override NODE --reason TEXT [--expires-in 7d] [--fingerprint FP]
                     [--kubeconfig K]
    fabricdra verify --clear-override NODE [--kubeconfig K]
    fabricdra verify ... --cabling-of NODE [--kubeconfig K]   also hold NODE to the controller's
                     scale-out cabling check (its Node's fabricdra.io/network.cabling record)

The cabling check needs every node's cabling (a rail's leaf is the one most of the block's
nodes reach), so a node cannot run it alone: `--cabling-of` reads the controller's verdict from
the API (docs/scale-out.md); without API access it is not run, and says so.

An override holds for the hardware the node has when it is given (the fingerprint its agent
records as `status.verification.currentFingerprint`) and until it expires; only the identities
the chart's admission policy names may set it (docs/verification.md).
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
from contextlib import ExitStack, closing
from datetime import UTC, datetime, timedelta
from typing import Any

from fabricdra.api.verification import ProbeResult, load_expectations, parse_profile
from fabricdra.kube.rest import NODE_DEVICES, NODES, ApiError, NotFound, Rest
from fabricdra.kubeletplugin.discovery.node import NvmlSource, discover
from fabricdra.kubeletplugin.discovery.nvml import SnapshotError, load_snapshot, read_live
from fabricdra.kubeletplugin.discovery.sysfs import RootError, SysfsTree
from fabricdra.kubeletplugin.samples import sample_node
from fabricdra.kubeletplugin.verification import (
    OVERRIDE_ANNOTATION,
    REVERIFY_ANNOTATION,
    Tools,
    fingerprint,
)
from fabricdra.kubeletplugin.verification.runner import run_once

from .common import UsageError, api_client, print_json
from .common import env as _env

USER_AGENT = "fabricdra-verify/0.2.0"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "verify",
        help="run the verification probes on this node; exit 1 unless it passes",
        description="Check that this node's GPUs and RDMA NICs work as their class promises "
        "(PCIe link, RDMA port rate and error counters, NVLink, and GPU/NIC bandwidth where "
        "nvbandwidth / ib_write_bw are installed). Exit 0 when every required probe ran and "
        "none failed, 1 otherwise, with a table of what did not pass. With --override or "
        "--clear-override it instead sets or clears a node's manual override in the cluster.",
    )
    a = p.add_argument
    a("--sysfs-root", default="/sys", help="root of the sysfs tree (default /sys)")
    a("--nvml-snapshot", metavar="FILE", help="recorded NVML answers instead of the library")
    a("--sample", action="store_true", help="verify the bundled sample node")
    a(
        "--tools-path",
        default=None,
        metavar="PATH",
        help="where nvbandwidth, ib_write_bw and all_reduce_perf are looked up (PATH syntax; "
        "default: $PATH)",
    )
    a(
        "--no-bandwidth",
        action="store_true",
        help="do not run the active probes (tools): Skipped, not required",
    )
    a(
        "--tool-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="longest one bandwidth tool may run (default 300)",
    )
    a(
        "--expect",
        metavar="FILE",
        help="system profile (YAML/JSON: gpus, hcas) to hold the node to, instead of the "
        "built-in one its DMI model names",
    )
    a("-o", "--output", choices=["table", "json"], default="table", help="output format")
    a("--all", action="store_true", help="list every probe, not only those that did not pass")
    a(
        "--override",
        metavar="NODE",
        help="mark NODE verified by hand, for the hardware it has now and until --expires-in "
        "(needs --reason; only the admins the chart's admission policy names may)",
    )
    a("--reason", help="why the override is justified (recorded in the node's status)")
    a(
        "--expires-in",
        default="7d",
        metavar="DURATION",
        help="how long the override holds: N followed by s, m, h or d (default 7d)",
    )
    a(
        "--fingerprint",
        metavar="FP",
        help="the hardware fingerprint the override is for (default: the one NODE's agent "
        "recorded in its NodeDevices status, currentFingerprint)",
    )
    a("--clear-override", metavar="NODE", help="remove NODE's manual override")
    a(
        "--node",
        metavar="NODE",
        help="ask NODE's agent to verify again (after a repair): sets the "
        f"{REVERIFY_ANNOTATION} annotation, which the agent removes once it has rerun",
    )
    a(
        "--cabling-of",
        metavar="NODE",
        help="also hold the run to NODE's scale-out cabling check, as the controller recorded "
        "it on the Node (fabricdra.io/network.cabling): Failed fails the run, naming why",
    )
    a(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig for --node/--override/--clear-override/--cabling-of "
        "[FABRICDRA_KUBECONFIG]",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if sum(bool(x) for x in (args.override, args.clear_override, args.node)) > 1:
        raise UsageError("--node, --override and --clear-override exclude each other")
    if args.node:
        return _request_reverify(args)
    if args.override or args.clear_override:
        return _set_override(args)
    if args.reason:
        raise UsageError("--reason goes with --override")
    if args.fingerprint:
        raise UsageError("--fingerprint goes with --override")
    return _verify(args)


def _verify(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        root, snapshot = args.sysfs_root, args.nvml_snapshot
        if args.sample:
            sample_root, sample_snapshot = stack.enter_context(sample_node())
            root, snapshot = str(sample_root), snapshot or str(sample_snapshot)
        try:
            tree = stack.enter_context(closing(SysfsTree(root)))
            nvml_source: NvmlSource = read_live
            if snapshot is not None:
                readings = load_snapshot(snapshot)
                nvml_source = lambda: readings  # noqa: E731
        except (RootError, SnapshotError) as e:
            raise UsageError(str(e)) from e
        d = discover(tree, nvml_source=nvml_source)
        if d.interfaces is None or d.accelerators is None:
            # Never a pass on a node we could not read: say what failed, exit 1.
            print(f"fabricdra verify: cannot read the node: {d.failures}", file=sys.stderr)
            return 1
        expect = None
        if args.expect:
            try:
                with open(args.expect) as f:
                    expect = parse_profile(f.read())
            except (OSError, ValueError) as e:
                raise UsageError(f"--expect {args.expect}: {e}") from e
        tools = Tools(
            path=args.tools_path,
            timeout_seconds=args.tool_timeout,
            run_bandwidth=not args.no_bandwidth,
        )
        result = run_once(
            tree,
            d.interfaces,
            d.accelerators,
            d.nvml,
            fingerprint(tree, d.interfaces, d.accelerators),
            expectations=load_expectations(),
            tools=tools,
            expect=expect,
        )
    cabling = _cabling(args) if args.cabling_of else None
    cabling_failed = cabling is not None and cabling.get("result") != "Passed"
    passed = result.passed and not cabling_failed
    if args.output == "json":
        print_json(
            {
                "passed": passed,
                "reason": result.reason,
                **({"scaleOutCabling": cabling} if cabling is not None else {}),
                "time": result.time.isoformat().replace("+00:00", "Z"),
                "fingerprint": result.fingerprint,
                "probes": [p.model_dump(mode="json", exclude_none=True) for p in result.probes],
            }
        )
    else:
        shown = result.probes if args.all else [p for p in result.probes if p.outcome != "Passed"]
        print(("PASSED: " if passed else "NOT PASSED: ") + result.reason)
        if shown:
            print(table(shown))
        if cabling is not None:
            findings = "; ".join(cabling.get("findings") or [])
            print(
                f"SCALE-OUT CABLING ({args.cabling_of}): {cabling.get('result')}"
                + (f": {findings}" if findings else "")
            )
    return 0 if passed else 1


def cabling_verdict(node: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """The controller's cabling record on the Node, or why there is none (never a pass)."""
    from fabricdra.api.labels import CABLING_CHECK

    if node is None:
        return {"result": "NotRun", "findings": [f"no Node {name}"]}
    raw = (node["metadata"].get("annotations") or {}).get(CABLING_CHECK)
    if raw is None:
        return {
            "result": "NotRun",
            "findings": [
                "no cabling record: the controller runs the check only with --scale-out-tiers, "
                "on nodes whose leaf is known"
            ],
        }
    try:
        record = json.loads(raw)
    except ValueError:
        return {"result": "Unreadable", "findings": [f"{CABLING_CHECK}: {raw[:80]}"]}
    return dict(record) if isinstance(record, dict) else {"result": "Unreadable", "findings": []}


def _cabling(args: argparse.Namespace) -> dict[str, Any]:
    api = api_client(args.kubeconfig, USER_AGENT)
    try:
        node = Rest(api).get(NODES, args.cabling_of)
    except NotFound:
        return cabling_verdict(None, args.cabling_of)
    except ApiError as e:
        return {"result": "NotRun", "findings": [f"cannot read Node {args.cabling_of}: {e}"]}
    finally:
        api.close()
    return cabling_verdict(node, args.cabling_of)


def table(probes: list[ProbeResult]) -> str:
    header = ("PROBE", "DEVICE", "CLASS", "OUTCOME", "MEASURED", "EXPECTED", "REASON")
    rows = [
        (
            p.probe,
            p.device,
            p.deviceClass,
            p.outcome,
            p.measured or "-",
            p.expected or "-",
            p.reason or "-",
        )
        for p in probes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)] + [r[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _now() -> str:
    return _stamp(datetime.now(UTC).replace(microsecond=0))


def _stamp(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _request_reverify(args: argparse.Namespace) -> int:
    # A new value each time (who, when): a request made while the agent runs an older one
    # is not removed with it.
    value = json.dumps({"by": getpass.getuser(), "time": _now()}, sort_keys=True)
    if not _annotate(args, args.node, REVERIFY_ANNOTATION, value):
        return 1
    print(f"node {args.node}: verification requested; its agent reruns at its next pass")
    return 0


def _annotate(args: argparse.Namespace, node: str, key: str, value: str | None) -> bool:
    api = api_client(args.kubeconfig, USER_AGENT)
    try:
        Rest(api).patch(NODES, node, {"metadata": {"annotations": {key: value}}})
    except NotFound as e:
        raise UsageError(f"node {node} not found") from e
    except ApiError as e:
        print(f"fabricdra verify: cannot update node {node}: {e}", file=sys.stderr)
        return False
    finally:
        api.close()
    return True


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """'90m', '12h', '7d' -> a positive timedelta."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", text)
    if m is None or int(m.group(1)) == 0:
        raise UsageError(f"--expires-in {text!r}: give a positive N followed by s, m, h or d")
    return timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


def _current_fingerprint(args: argparse.Namespace, node: str) -> str:
    """The fingerprint NODE's agent recorded for the hardware it has now."""
    api = api_client(args.kubeconfig, USER_AGENT)
    try:
        live = Rest(api).get_or_none(NODE_DEVICES, node)
    finally:
        api.close()
    v = ((live or {}).get("status") or {}).get("verification") or {}
    fp = v.get("currentFingerprint")
    if not isinstance(fp, str) or not fp:
        raise UsageError(
            f"node {node}: its agent has recorded no hardware fingerprint "
            "(status.verification.currentFingerprint of its NodeDevices): give --fingerprint, "
            "as `fabricdra verify -o json` on the node prints it"
        )
    return fp


def _set_override(args: argparse.Namespace) -> int:
    node = args.override or args.clear_override
    value: str | None = None
    if args.override:
        if not args.reason or not args.reason.strip():
            raise UsageError("--override needs --reason: the override is recorded with it")
        lasts = parse_duration(args.expires_in)
        fp = args.fingerprint or _current_fingerprint(args, node)
        now = datetime.now(UTC).replace(microsecond=0)
        value = json.dumps(
            {
                "reason": args.reason.strip(),
                "by": getpass.getuser(),
                "time": _stamp(now),
                # bound to this hardware, for this long (docs/verification.md)
                "fingerprint": fp,
                "expires": _stamp(now + lasts),
            },
            sort_keys=True,
        )
    elif args.fingerprint:
        raise UsageError("--fingerprint goes with --override")
    if not _annotate(args, node, OVERRIDE_ANNOTATION, value):
        return 1
    if value is None:
        print(f"node {node}: override cleared; its agent applies it at its next pass")
    else:
        print(
            f"node {node}: marked verified by hand until {json.loads(value)['expires']}, for "
            f"hardware {json.loads(value)['fingerprint']}; its agent applies it at its next pass"
        )
    return 0
