"""What every subcommand shares: the usage error, JSON output, `FABRICDRA_*` defaults, the
API client and stop signals."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def print_json(doc: object) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


def env(name: str, default: str | None = None) -> str | None:
    """A flag's default from its environment variable `FABRICDRA_<NAME>` (the flag wins)."""
    return os.environ.get(f"FABRICDRA_{name}", default)


class EnvDefault:
    """A flag's default taken from an environment variable, checked after parsing.

    Checked then, not when the parser is built, so that a value the command line overrides is
    never looked at, and a bad one is a one-line usage error naming the variable (exit 2), not
    a traceback. The command's parser resolves every one left in the parsed arguments
    (`resolve_env_defaults`).
    """

    def __init__(
        self,
        var: str,
        raw: str,
        convert: Callable[[str], Any],
        what: str,
        choices: Collection[Any] | None = None,
    ) -> None:
        self.var, self.raw, self.convert, self.what, self.choices = var, raw, convert, what, choices

    def resolve(self) -> Any:
        try:
            value = self.convert(self.raw)
        except ValueError:
            raise UsageError(f"{self.var}={self.raw!r} is not {self.what}") from None
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(str(c) for c in self.choices)
            raise UsageError(f"{self.var}={self.raw!r} is not one of: {allowed}")
        return value

    def __repr__(self) -> str:  # what --help would show
        return repr(self.raw)


def resolve_env_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Replace each flag default still read from the environment by its checked value."""
    for key, value in vars(args).items():
        if isinstance(value, EnvDefault):
            setattr(args, key, value.resolve())
    return args


def _typed_env(
    name: str, default: Any, convert: Callable[[str], Any], what: str, empty: Any
) -> Any:
    var = f"FABRICDRA_{name}"
    raw = os.environ.get(var)
    if raw is None:
        return default
    if raw == "":
        # An empty variable (a chart value left blank) has always meant the default, or, for
        # the few flags whose 0 disables something, `empty`.
        return default if empty is None else empty
    return EnvDefault(var, raw.strip(), convert, what)


def env_int(name: str, default: int, *, empty: int | None = None) -> Any:
    """An integer flag's default from `FABRICDRA_<NAME>`; an empty variable gives `empty`
    (else `default`)."""
    return _typed_env(name, default, int, "an integer", empty)


def env_float(name: str, default: float, *, empty: float | None = None) -> Any:
    """A number flag's default from `FABRICDRA_<NAME>`; an empty variable gives `empty`
    (else `default`)."""
    return _typed_env(
        name, float(default), _finite_float, "a number", None if empty is None else float(empty)
    )


def env_choice(name: str, default: str | None, choices: Collection[str]) -> Any:
    """A flag's default from `FABRICDRA_<NAME>`, one of `choices` (argparse checks only what
    the command line gives, never a default)."""
    var = f"FABRICDRA_{name}"
    raw = os.environ.get(var)
    if raw is None or raw == "":
        return default
    return EnvDefault(var, raw, str, "a string", choices)


def env_bool(name: str, default: bool) -> Any:
    """A switch's default from `FABRICDRA_<NAME>`: true/yes/1 or false/no/0 (any case); an
    empty variable gives `default`."""
    return _typed_env(name, default, _bool, "true or false", None)


def _bool(text: str) -> bool:
    word = text.lower()
    if word in ("1", "true", "yes"):
        return True
    if word in ("0", "false", "no"):
        return False
    raise ValueError(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "nan", "inf": no interval or timeout means that
        raise ValueError(text)
    return value


def add_node_plugin_flags(
    p: argparse.ArgumentParser, *, plugin_dir: str, plugin_dir_help: str
) -> None:
    """The flags every kubelet plugin takes, defined once (each driver's plugin folder
    differs only in its default)."""
    a = p.add_argument
    a("--node-name", default=env("NODE_NAME"), help="this node's name [FABRICDRA_NODE_NAME]")
    a(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig file; default: the in-cluster service account [FABRICDRA_KUBECONFIG]",
    )
    a(
        "--cdi-dir",
        default=env("CDI_DIR", "/var/run/cdi"),
        help="where claim CDI specs are written (default /var/run/cdi) [FABRICDRA_CDI_DIR]",
    )
    a(
        "--plugin-dir",
        default=env("PLUGIN_DIR", plugin_dir),
        help=f"{plugin_dir_help} (default {plugin_dir}) [FABRICDRA_PLUGIN_DIR]",
    )
    a(
        "--registry-dir",
        default=env("REGISTRY_DIR", "/var/lib/kubelet/plugins_registry"),
        help="kubelet's plugin registration folder [FABRICDRA_REGISTRY_DIR]",
    )
    a(
        "--pod-uid",
        default=env("POD_UID"),
        help="this pod's UID (downward API metadata.uid): per-pod socket names "
        "<driver>-<uid>-reg.sock and dra-<uid>.sock, so a rolling update's new pod and old "
        "pod serve side by side (kubelet 1.33+); empty: <driver>-reg.sock and dra.sock "
        "[FABRICDRA_POD_UID]",
    )
    a("--dev-root", default=env("DEV_ROOT", "/dev"), help="host /dev [FABRICDRA_DEV_ROOT]")
    a("--proc-root", default=env("PROC_ROOT", "/proc"), help="host /proc [FABRICDRA_PROC_ROOT]")


def api_client(kubeconfig: str | None, user_agent: str | None = None) -> Any:
    """A kubernetes ApiClient from a kubeconfig file, else from the in-cluster account."""
    from kubernetes import client
    from kubernetes import config as kube_config

    loader: Any = kube_config  # its loaders carry no type hints
    try:
        if kubeconfig:
            api = loader.new_client_from_config(config_file=kubeconfig)
        else:
            cfg = client.Configuration()
            loader.load_incluster_config(client_configuration=cfg)
            api = client.ApiClient(cfg)
    except Exception as e:  # a missing file, a bad context, no service account
        raise UsageError(f"cannot load Kubernetes credentials: {e}") from None
    if user_agent:
        api.user_agent = user_agent
    return api


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT: how a long-running subcommand learns to stop.

    The handler does not set it itself: Python runs a handler in the main thread between two
    bytecodes, which may be inside that thread's own `stop.wait()` while it holds the event's
    lock, and `set()` there waits for that lock for ever (seen: `fabricdra fleet --watch`
    hung on SIGINT). A short thread sets it once the lock is free."""
    # Here: only the long-running subcommands stop on signals; `fabricdra inventory` need not
    # import signal and threading.
    import signal
    import threading

    stop = threading.Event()

    def handler(*_: object) -> None:
        threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
