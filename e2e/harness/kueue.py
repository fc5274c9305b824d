"""Kueue's manager as a real controller against a harness control plane.

Kueue (https://kueue.sigs.k8s.io) is built from its Go module by `e2e/cluster/build.sh --kueue`,
which also copies what a Kueue install applies from the module's source: the CRDs
(config/components/crd/bases) and the webhook configurations (config/components/webhook).
Kueue runs on the host like the scheduler and the KCM, with:

- its webhooks served on 127.0.0.1 with a certificate from the harness CA, and registered by
  URL (Kueue's own manifests name a Service, which nothing here routes to). Kueue's internal
  certificate management is off: it expects the certificates mounted from a Secret by a kubelet.
  Only the webhooks of the integrations turned on (`frameworks`) and of Kueue's own API are
  registered; the Job webhook is the one that suspends a queued Job until Kueue admits it.
- with internal certificate management off Kueue reads its metrics certificate from a fixed
  path, /etc/kueue/metrics/certs (cmd/kueue/main.go), whether or not metrics are served: the
  harness writes one there and removes it at stop(). Metrics are not served (bindAddress "0").
- leader election off, the visibility API server off (it needs an APIService and more certs),
  the CRDs without their conversion webhooks (storage and every request here is v1beta2).
- cluster-admin rights (a client certificate in `system:masters`, user `kueue-manager`): the
  tests exercise placement, not Kueue's RBAC.

Topology-aware scheduling (feature gate `TopologyAwareScheduling`, beta and on by default since
Kueue 0.14) needs nothing more.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import binaries
from e2e.harness.controlplane import START_TIMEOUT, ControlPlane, _start_on_free_ports
from e2e.harness.errors import HarnessError
from e2e.harness.poll import wait_for
from e2e.harness.process import Daemon, free_port

NAMESPACE = "kueue-system"
API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's cmd/kueue/main.go
WEBHOOK_CONFIGURATION = "kueue-{kind}-webhook-configuration"
# Which API groups each integration's webhooks are for (Kueue's `integrations.frameworks`).
FRAMEWORK_GROUPS = {"batch/job": "batch"}
PLURALS = {
    "Topology": "topologies",
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "Workload": "workloads",
}


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


class Kueue:
    """Kueue's manager for `control_plane`: start() installs its CRDs, starts it, waits for it
    to be ready and registers its webhooks; stop() ends it and removes its metrics cert."""

    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        frameworks: tuple[str, ...] = ("batch/job",),
        feature_gates: dict[str, bool] | None = None,
    ) -> None:
        """`frameworks`: Kueue's integrations (only `batch/job` is wired); `feature_gates`:
        Kueue's, beside the harness's (`VisibilityOnDemand` off)."""
        unknown = [f for f in frameworks if f not in FRAMEWORK_GROUPS]
        if unknown:
            raise HarnessError(
                f"Kueue integrations {unknown} are not wired in the harness "
                f"(known: {sorted(FRAMEWORK_GROUPS)})"
            )
        self.control_plane = control_plane
        self.frameworks = frameworks
        self.feature_gates = {"VisibilityOnDemand": False, **(feature_gates or {})}
        self.workdir = control_plane.workdir / "kueue"
        self.log = control_plane.logs_dir / "kueue.log"
        self.webhook_port = 0
        self.health_port = 0
        self._daemon: Daemon | None = None
        self._made_metrics_dirs: list[Path] = []

    @property
    def manifests(self) -> Path:
        return binaries.bin_dir() / "kueue-manifests"

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        return self._daemon is not None and self._daemon.alive()

    def stop(self) -> None:
        """Stop Kueue and remove what it left on the machine (the metrics certificate)."""
        if self._daemon is not None:
            self._daemon.stop()
        for name in ("tls.crt", "tls.key"):
            with contextlib.suppress(FileNotFoundError):
                (METRICS_CERT_DIR / name).unlink()
        made, self._made_metrics_dirs = self._made_metrics_dirs, []
        for folder in made:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()

    # -- start ------------------------------------------------------------------------------

    def _start(self) -> None:
        bin_dir = binaries.ensure(binaries.KUEUE, kueue=True)
        cp = self.control_plane
        self.workdir.mkdir(parents=True, exist_ok=True)
        serving = cp.pki.serving("kueue-webhook", ["localhost"], ["127.0.0.1"])
        cert_dir = self.workdir / "webhook-certs"
        cert_dir.mkdir(exist_ok=True)
        shutil.copyfile(serving.cert, cert_dir / "tls.crt")
        shutil.copyfile(serving.key, cert_dir / "tls.key")
        self._write_metrics_cert(serving.cert, serving.key)
        kubeconfig = cp.kubeconfig_for("kueue", "kueue-manager", ("system:masters",))
        cp.create_namespace(NAMESPACE)
        self._install_crds()

        def start() -> Daemon:
            self.webhook_port, self.health_port = free_port(), free_port()
            config = self.workdir / "config.yaml"
            config.write_text(yaml.safe_dump(self._config(cert_dir)))
            return Daemon(
                "kueue",
                [str(bin_dir / "kueue"), f"--config={config}", f"--kubeconfig={kubeconfig}"],
                self.log,
                die_with_parent=not cp.detached,
            )

        def ready(daemon: Daemon) -> None:
            # /readyz: the webhook server is serving and the caches are synced.
            wait_for(
                lambda: _http_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
                timeout=START_TIMEOUT,
                what="ready (/readyz)",
                daemon=daemon,
            )

        self._daemon = cp.adopt(_start_on_free_ports(start, ready))
        self._register_webhooks(cp.pki.ca.cert.read_bytes())

    def _config(self, cert_dir: Path) -> dict[str, Any]:
        """Kueue's Configuration (apis/config/v1beta2)."""
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": list(self.frameworks)},
            "featureGates": self.feature_gates,
        }

    def _write_metrics_cert(self, cert: Path, key: Path) -> None:
        missing = [p for p in (METRICS_CERT_DIR, *METRICS_CERT_DIR.parents) if not p.exists()]
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        self._made_metrics_dirs = missing  # deepest first, the order stop() removes them in
        shutil.copyfile(cert, METRICS_CERT_DIR / "tls.crt")
        shutil.copyfile(key, METRICS_CERT_DIR / "tls.key")

    def _install_crds(self) -> None:
        from kubernetes import client

        crds = [yaml.safe_load(p.read_text()) for p in sorted((self.manifests / "crd").glob("*"))]
        if not crds:
            raise HarnessError(f"no Kueue CRDs in {self.manifests / 'crd'}: rerun build.sh --kueue")
        with self.control_plane.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            for crd in crds:
                ext.create_custom_resource_definition(crd)

            def established() -> bool:
                for crd in crds:
                    got = ext.read_custom_resource_definition(crd["metadata"]["name"])
                    status = got.status
                    conditions = {c.type: c.status for c in (status and status.conditions) or []}
                    if conditions.get("Established") != "True":
                        return False
                return True

            wait_for(established, timeout=60, what="Kueue's CRDs established")

    def _register_webhooks(self, ca: bytes) -> None:
        """Kueue's own webhook configurations, each webhook pointed at 127.0.0.1 by URL."""
        from kubernetes import client

        groups = {API_GROUP, *(FRAMEWORK_GROUPS[f] for f in self.frameworks)}
        docs = list(yaml.safe_load_all((self.manifests / "webhooks.yaml").read_text()))
        with self.control_plane.api_client() as api:
            admission = client.AdmissionregistrationV1Api(api)
            for doc in docs:
                if not doc:
                    continue
                kind = "mutating" if doc["kind"] == "MutatingWebhookConfiguration" else "validating"
                hooks = [
                    self._by_url(hook, ca)
                    for hook in doc.get("webhooks", [])
                    if _groups(hook) <= groups
                ]
                # The manifest's own fields, sent as is (whatever the client's models know).
                body: Any = {
                    "apiVersion": doc["apiVersion"],
                    "kind": doc["kind"],
                    "metadata": {"name": WEBHOOK_CONFIGURATION.format(kind=kind)},
                    "webhooks": hooks,
                }
                if kind == "mutating":
                    admission.create_mutating_webhook_configuration(body)
                else:
                    admission.create_validating_webhook_configuration(body)

    def _by_url(self, hook: dict[str, Any], ca: bytes) -> dict[str, Any]:
        path = hook["clientConfig"]["service"]["path"]
        return {
            **hook,
            "clientConfig": {
                "url": f"https://127.0.0.1:{self.webhook_port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            },
        }


def _groups(hook: dict[str, Any]) -> set[str]:
    return {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}


def create_objects(control_plane: ControlPlane, objects: Iterable[dict[str, Any]]) -> None:
    """Create Kueue objects (Topology, ResourceFlavor, ClusterQueue: cluster-scoped; LocalQueue
    and the rest: in their metadata.namespace)."""
    from kubernetes import client

    with control_plane.api_client() as api:
        custom = client.CustomObjectsApi(api)
        for obj in objects:
            group, version = obj["apiVersion"].split("/")
            plural = PLURALS[obj["kind"]]
            namespace = obj["metadata"].get("namespace")
            if namespace:
                custom.create_namespaced_custom_object(group, version, namespace, plural, obj)
            else:
                custom.create_cluster_custom_object(group, version, plural, obj)


__all__ = ["API_GROUP", "API_VERSION", "NAMESPACE", "Kueue", "create_objects"]
