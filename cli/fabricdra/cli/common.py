"""What every subcommand shares: the usage error, JSON output, `FABRICDRA_*` defaults, the
API client and stop signals."""

from __future__ import annotations

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
