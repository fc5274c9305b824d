"""The `fabricdra` command: one binary, one subcommand per component or tool."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import cleanup, compute_domain, controller, fleet, inventory, kubelet_plugin, logs, verify
from .common import UsageError, print_json

__all__ = ["UsageError", "build_parser", "main", "print_json"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fabricdra",
        description="Kubernetes DRA driver for accelerators, RDMA NICs and their fabric.",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="minimum level of the JSON logs written to stderr (default: info)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # One module per subcommand family; each registers its own subparsers.
    for module in (inventory, verify, fleet, kubelet_plugin, controller, compute_domain, cleanup):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)
    try:
        code: int = args.run(args)
    except UsageError as e:
        print(f"fabricdra {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return code
