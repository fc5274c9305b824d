"""Kubeconfig files for the harness's clients, written as JSON (valid YAML to every reader)."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.harness.pki import KeyPair


def write_kubeconfig(path: Path, *, server: str, ca: Path, user: str, creds: KeyPair) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "fabricdra-e2e",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(creds.cert), "client-key": str(creds.key)},
            }
        ],
        "contexts": [
            {"name": "fabricdra-e2e", "context": {"cluster": "fabricdra-e2e", "user": user}}
        ],
        "current-context": "fabricdra-e2e",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path
