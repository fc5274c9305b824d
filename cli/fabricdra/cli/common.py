"""What every subcommand shares: the usage error, JSON output, `FABRICDRA_*` defaults, the
API client and stop signals."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def print_json(doc: object) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


def env(name: str, default: str | None = None) -> str | None:
    """A flag's default from its environment variable `FABRICDRA_<NAME>` (the flag wins)."""
    return os.environ.get(f"FABRICDRA_{name}", default)


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
    """An event set by SIGTERM or SIGINT: how a long-running subcommand learns to stop."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop
