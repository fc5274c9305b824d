"""An already running cluster (kind, or up.sh's) used instead of starting one.

Set FABRICDRA_E2E_KUBECONFIG to its kubeconfig and the `node_cluster` fixture yields this
object. Its node's paths are the kubelet defaults; they are on this machine only when
`is_local` (FABRICDRA_E2E_LOCAL=1, e.g. for up.sh's cluster) - on kind they are inside the
node container, so tests that place files or sockets on the node must deploy through the API
(the Helm chart) there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from e2e.harness.errors import HarnessError

KUBECONFIG_ENV = "FABRICDRA_E2E_KUBECONFIG"
_CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"


class ExistingCluster:
    def __init__(self, kubeconfig: Path, *, node_name: str | None = None) -> None:
        if not kubeconfig.is_file():
            raise HarnessError(f"{KUBECONFIG_ENV}={kubeconfig}: no such file")
        self.kubeconfig = kubeconfig
        self.is_local = os.environ.get("FABRICDRA_E2E_LOCAL") == "1"
        root = Path(os.environ.get("FABRICDRA_E2E_KUBELET_ROOT", "/var/lib/kubelet"))
        self.kubelet_root = root
        self.plugins_registry_dir = root / "plugins_registry"
        self.plugins_dir = root / "plugins"
        self.cdi_dir = Path("/var/run/cdi")
        self.logs_dir: Path | None = None
        with self.api_client() as api:
            self.server: str = api.configuration.host
            if node_name is None:
                node_name = self._only_node(api)
        self.node_name = os.environ.get("FABRICDRA_E2E_NODE", node_name)

    @staticmethod
    def _only_node(api: Any) -> str:
        from kubernetes import client

        nodes = client.CoreV1Api(api).list_node().items
        if not nodes:
            raise HarnessError("the cluster has no nodes")
        # On kind with several nodes, prefer a worker; FABRICDRA_E2E_NODE overrides.
        names = {n.metadata.name: n.metadata.labels or {} for n in nodes if n.metadata}
        workers = [n for n, labels in names.items() if _CONTROL_PLANE_ROLE not in labels]
        return str((workers or list(names))[0])

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )

    def start(self) -> None:
        """Nothing to start: the cluster is someone else's."""

    def stop(self) -> None:
        """Nothing to stop: the cluster outlives the test session."""
