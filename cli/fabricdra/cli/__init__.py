"""The `fabricdra` command: one binary, one subcommand per component or tool.

Start-up: a process imports only the module of the subcommand it runs (`fabricdra inventory`
never loads the controller, the kubernetes client or gRPC). `COMMANDS` names each
subcommand's module and repeats its one-line help, so that `fabricdra --help` and the
dispatch import none of them; tests/unit/test_cli_startup.py checks the two stay in step.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from . import logs
from .common import UsageError, print_json, resolve_env_defaults

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "print_json"]

# subcommand -> (module in fabricdra.cli that registers it, its one-line help), in the order
# `fabricdra --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "inventory": ("inventory", "print this node's interfaces, accelerators and labels as JSON"),
    "nvml-snapshot": (
        "inventory",
        "record this host's NVML answers as JSON, for --nvml-snapshot elsewhere",
    ),
    "verify": ("verify", "run the verification probes on this node; exit 1 unless it passes"),
    "fleet": (
        "fleet",
        "print devices total/healthy/verified/allocated/free per fabric domain and class",
    ),
    "topology": (
        "topology",
        "print the cluster's scale-out tree (table, json, Slurm topology.yaml, Kueue Topology)",
    ),
    "fabric-dump": (
        "topology",
        "store an ibnetdiscover dump in the ConfigMap the controller reads",
    ),
    "kubelet-plugin": (
        "kubelet_plugin",
        "run the devices.fabricdra.io kubelet DRA plugin on this node",
    ),
    "controller": ("controller", "run the ComputeDomain controller"),
    "compute-domain-plugin": (
        "compute_domain",
        "run the compute-domain.fabricdra.io kubelet DRA plugin on this node",
    ),
    "imex-daemon": (
        "compute_domain",
        "run IMEX for one ComputeDomain on this node (started by the controller)",
    ),
    "cleanup": ("cleanup", "remove what fabricdra made in the cluster (run by `helm uninstall`)"),
    "wait-for-driver": (
        "driverwait",
        "wait until the NVIDIA driver is under the driver root (node pods' init container)",
    ),
}


class _Version(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked for
    (importlib.metadata costs start-up time every other run would pay)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("fabricdra")
        except PackageNotFoundError:  # run from a source tree that was never installed
            text = "unknown"
        print(f"fabricdra {text}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """Resolves the flag defaults read from the environment once parsing is done, so that a
    bad variable is a `UsageError` naming it (`common.EnvDefault`)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        return resolve_env_defaults(parsed), extras


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. Subcommands in `commands` (default: all) get their full
    parser, which imports their module; the others are listed with their help only."""
    wanted = set(COMMANDS if commands is None else commands)
    # A module registers every subcommand it holds (inventory: nvml-snapshot too).
    modules = {module for name, (module, _) in COMMANDS.items() if name in wanted}
    parser = _Parser(
        prog="fabricdra",
        description="Kubernetes DRA driver for accelerators, RDMA NICs and their fabric.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="minimum level of the JSON logs written to stderr (default: info)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    registered: set[str] = set()
    for name, (module_name, help_text) in COMMANDS.items():
        if name in registered:
            continue
        if module_name in modules:
            module = importlib.import_module(f"{__name__}.{module_name}")
            before = set(sub.choices)
            module.register(sub)
            registered |= set(sub.choices) - before
        else:
            sub.add_parser(name, help=help_text, add_help=False)
            registered.add(name)
    for subparser in sub.choices.values():
        subparser.add_argument("--version", action=_Version, help="print the version and exit")
    return parser


class _Quiet(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _NoCommand(message)


class _NoCommand(Exception):
    pass


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names, found by a parser that knows every subcommand by name
    only, so nothing but this package is imported. It prints nothing: help, --version and
    every error are the full parser's."""
    parser = _Quiet(prog="fabricdra", add_help=False)
    parser.add_argument("--log-level")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        sub.add_parser(name, add_help=False)
    try:
        args, _ = parser.parse_known_args(argv)
    except _NoCommand:
        return None
    command: str | None = args.command
    return command


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    try:
        args = build_parser([command] if command else ()).parse_args(argv)
        logs.configure(args.log_level)
        code: int = args.run(args)
    except UsageError as e:
        print(f"fabricdra {command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return code
