"""A real Kubernetes control plane on loopback: etcd + kube-apiserver, plus scheduler and KCM.

Everything lives in one work directory (certificates, etcd data, audit log, component logs),
listens only on 127.0.0.1 on free ports, and is stopped by stop() whatever state it is in.
Binaries come from e2e/cluster/build.sh (see binaries.py).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.request
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from e2e.harness import binaries
from e2e.harness.errors import HarnessError
from e2e.harness.kubeconfig import write_kubeconfig
from e2e.harness.pki import KeyPair, Pki
from e2e.harness.poll import wait_for
from e2e.harness.process import Daemon, free_port

# Metadata for every request, one event per request (ResponseComplete), so counting writes by
# a component is counting lines.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted", "Panic"],
    "rules": [{"level": "Metadata"}],
}

SERVICE_CIDR = "10.0.0.0/24"
START_TIMEOUT = 180.0  # seconds; the apiserver alone takes ~15 s on 2 busy cores
_PORT_RETRIES = 3


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        return bool(response.status == 200)


def _insecure_context() -> ssl.SSLContext:
    """For /healthz of the scheduler and KCM, which serve a self-signed cert of their own."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _start_on_free_ports(start: Callable[[], Daemon], ready: Callable[[Daemon], None]) -> Daemon:
    """Start a daemon on freshly picked ports; pick again if another process took one first."""
    for attempt in range(_PORT_RETRIES):
        daemon = start()
        try:
            ready(daemon)
            return daemon
        except HarnessError:
            daemon.stop()
            log = daemon.log.read_text(errors="replace")
            if "address already in use" not in log or attempt == _PORT_RETRIES - 1:
                raise
            daemon.log.rename(daemon.log.with_suffix(f".attempt{attempt}.log"))
    raise AssertionError("unreachable")


class ControlPlane:
    """etcd + kube-apiserver. Use as a context manager, or call start() and stop()."""

    def __init__(
        self,
        workdir: Path,
        *,
        bin_dir: Path | None = None,
        detached: bool = False,
        on_adopt: Callable[[Daemon], None] | None = None,
        apiserver_flags: tuple[str, ...] = (),
    ) -> None:
        """`detached`: the daemons may outlive this Python process (up.sh); `on_adopt` is
        called with each daemon once it is up, so a caller can record its pid;
        `apiserver_flags` are added to kube-apiserver's (e.g. `--feature-gates=...`)."""
        self.workdir = workdir
        self.apiserver_flags = apiserver_flags
        self.detached = detached
        self._on_adopt = on_adopt
        self.logs_dir = workdir / "logs"
        self.audit_log = workdir / "audit.log"
        self.kubeconfig = workdir / "admin.kubeconfig"
        self.server = ""
        self.port = 0
        self._bin_dir = bin_dir
        self._daemons: list[Daemon] = []
        self._pki: Pki | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = binaries.ensure(binaries.CONTROL_PLANE)
        return self._bin_dir

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            raise HarnessError("the control plane is not started")
        return self._pki

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop everything this object started, newest first. Idempotent."""
        while self._daemons:
            self._daemons.pop().stop()

    def adopt(self, daemon: Daemon) -> Daemon:
        """Tie a daemon started for this control plane (scheduler, kubelet...) to its stop()."""
        self._daemons.append(daemon)
        if self._on_adopt is not None:
            self._on_adopt(daemon)
        return daemon

    @property
    def daemons(self) -> list[Daemon]:
        """Running daemons, oldest first."""
        return list(self._daemons)

    def _start(self) -> None:
        bin_dir = self.bin_dir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._pki = pki = Pki(self.workdir / "pki")
        serving = pki.serving(
            "kube-apiserver",
            dns=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ips=["127.0.0.1", "10.0.0.1"],
        )
        admin = pki.client("admin", "fabricdra-e2e-admin", ("system:masters",))
        kubelet_client = pki.client(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        sa = pki.rsa_key_pair("service-account")
        # The aggregation layer's front-proxy identity. Without it every delegating component
        # (scheduler, KCM, webhook servers) logs "missing content for CA bundle" forever.
        front_proxy = pki.client("front-proxy-client", "front-proxy-client")
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))

        etcd_url = self._start_etcd(bin_dir)

        def start_apiserver() -> Daemon:
            self.port = free_port()
            self.server = f"https://127.0.0.1:{self.port}"
            return Daemon(
                "kube-apiserver",
                [
                    str(bin_dir / "kube-apiserver"),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.port}",
                    # Loopback cannot be an Endpoints address; with no reconciler nothing
                    # publishes one, and in-cluster clients are pointed at 127.0.0.1 directly.
                    "--advertise-address=127.0.0.1",
                    "--endpoint-reconciler-type=none",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-private-key-file={serving.key}",
                    f"--client-ca-file={pki.ca.cert}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={sa.cert}",
                    f"--service-account-signing-key-file={sa.key}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    "--allow-privileged=true",
                    f"--kubelet-client-certificate={kubelet_client.cert}",
                    f"--kubelet-client-key={kubelet_client.key}",
                    "--kubelet-preferred-address-types=Hostname,InternalIP",
                    f"--requestheader-client-ca-file={pki.ca.cert}",
                    "--requestheader-allowed-names=front-proxy-client",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={front_proxy.cert}",
                    f"--proxy-client-key-file={front_proxy.key}",
                    f"--audit-policy-file={policy}",
                    f"--audit-log-path={self.audit_log}",
                    "--audit-log-mode=blocking",  # an event is on disk before the response
                    "--v=2",
                    *self.apiserver_flags,
                ],
                self.logs_dir / "kube-apiserver.log",
                die_with_parent=not self.detached,
            )

        context = ssl.create_default_context(cafile=str(pki.ca.cert))
        context.load_cert_chain(str(admin.cert), str(admin.key))

        def apiserver_ready(daemon: Daemon) -> None:
            wait_for(
                lambda: _https_ok(f"{self.server}/readyz", context),
                timeout=START_TIMEOUT,
                what="ready (/readyz)",
                daemon=daemon,
            )

        self.adopt(_start_on_free_ports(start_apiserver, apiserver_ready))
        write_kubeconfig(
            self.kubeconfig, server=self.server, ca=pki.ca.cert, user="admin", creds=admin
        )

    def _start_etcd(self, bin_dir: Path) -> str:
        url = ""

        def start() -> Daemon:
            nonlocal url
            client, peer = free_port(), free_port()
            url = f"http://127.0.0.1:{client}"
            peer_url = f"http://127.0.0.1:{peer}"
            return Daemon(
                "etcd",
                [
                    str(bin_dir / "etcd"),
                    "--name=fabricdra-e2e",
                    f"--data-dir={self.workdir / 'etcd'}",
                    f"--listen-client-urls={url}",
                    f"--advertise-client-urls={url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=fabricdra-e2e={peer_url}",
                    "--unsafe-no-fsync",  # throwaway data: no fsync keeps 2 shared cores usable
                    "--log-level=warn",
                ],
                self.logs_dir / "etcd.log",
                die_with_parent=not self.detached,
            )

        def ready(daemon: Daemon) -> None:
            def healthy() -> bool:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    return bool(json.load(response).get("health") == "true")

            wait_for(healthy, timeout=60, what="healthy (/health)", daemon=daemon)

        self.adopt(_start_on_free_ports(start, ready))
        return url

    # -- clients ---------------------------------------------------------------------------

    def api_client(self) -> Any:
        """A fresh kubernetes.client.ApiClient with cluster-admin rights."""
        from kubernetes import config

        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )

    def kubeconfig_for(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for another identity (e.g. a component's RBAC user), signed by our CA."""
        creds = self.pki.client(name, user, groups)
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig",
            server=self.server,
            ca=self.pki.ca.cert,
            user=name,
            creds=creds,
        )

    def audit_events(
        self, *, user_agent: str | None = None, verbs: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """Audit events so far, oldest first; `user_agent` matches a substring."""
        wanted = set(verbs) if verbs is not None else None
        events = []
        with self.audit_log.open() as lines:
            for line in lines:
                if not line.strip():
                    continue
                event: dict[str, Any] = json.loads(line)
                if user_agent is not None and user_agent not in event.get("userAgent", ""):
                    continue
                if wanted is not None and event.get("verb") not in wanted:
                    continue
                events.append(event)
        return events

    def create_namespace(self, name: str) -> None:
        """A namespace and its `default` ServiceAccount (which the KCM would otherwise add),
        so pods can be created in it with or without a controller manager running."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
            with contextlib.suppress(ApiException):  # 409: the KCM was faster
                core.create_namespaced_service_account(
                    name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
                )

    def create_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A Node with no kubelet behind it: Ready, schedulable, with room for many pods."""
        from kubernetes import client

        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_node(
                client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels or {}))
            )
            core.patch_node_status(
                name,
                {
                    "status": {
                        "capacity": resources,
                        "allocatable": resources,
                        "addresses": [{"type": "Hostname", "address": name}],
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "FabricdraHarness",
                                "message": "fake node: no kubelet behind it",
                                "lastHeartbeatTime": now,
                                "lastTransitionTime": now,
                            }
                        ],
                    }
                },
            )
            # The TaintNodesByCondition admission plugin taints every new node not-ready; the
            # node-lifecycle controller would lift it once it sees Ready, but may not be running.
            core.patch_node(name, {"spec": {"taints": None}})


class _Component:
    """kube-scheduler or kube-controller-manager against a ControlPlane."""

    name = ""
    user = ""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.control_plane = control_plane
        self.kubeconfig = control_plane.kubeconfig_for(self.name, self.user)
        self.log = control_plane.logs_dir / f"{self.name}.log"
        self.port = 0
        self._daemon: Daemon | None = None

    def _flags(self) -> list[str]:
        return []

    def start(self) -> None:
        cp = self.control_plane
        cert_dir = cp.workdir / f"{self.name}-serving"

        def start() -> Daemon:
            self.port = free_port()
            return Daemon(
                self.name,
                [
                    str(cp.bin_dir / self.name),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.port}",
                    f"--cert-dir={cert_dir}",
                    "--leader-elect=false",
                    "--v=2",
                    *self._flags(),
                ],
                self.log,
                die_with_parent=not cp.detached,
            )

        def ready(daemon: Daemon) -> None:
            url = f"https://127.0.0.1:{self.port}/healthz"
            wait_for(
                lambda: _https_ok(url, _insecure_context()),
                timeout=START_TIMEOUT,
                what="healthy (/healthz)",
                daemon=daemon,
            )

        self._daemon = cp.adopt(_start_on_free_ports(start, ready))

    def stop(self) -> None:
        if self._daemon is not None:
            self._daemon.stop()

    def alive(self) -> bool:
        return self._daemon is not None and self._daemon.alive()


class KubeScheduler(_Component):
    name = "kube-scheduler"
    user = "system:kube-scheduler"


class KubeControllerManager(_Component):
    """The KCM with its default controllers (`--controllers=*`).

    `node_monitor_grace_period`: how long a node may go without a heartbeat before the
    node-lifecycle controller marks it unreachable and taints it. Nodes from create_node()
    have no kubelet and never heartbeat, so the control-plane fixture makes this a year.
    """

    name = "kube-controller-manager"
    user = "system:kube-controller-manager"

    def __init__(self, control_plane: ControlPlane, *, node_monitor_grace_period: str = "40s"):
        super().__init__(control_plane)
        self.node_monitor_grace_period = node_monitor_grace_period

    def _flags(self) -> list[str]:
        pki = self.control_plane.pki
        return [
            "--controllers=*",
            f"--root-ca-file={pki.ca.cert}",
            f"--service-account-private-key-file={pki.dir / 'service-account.key'}",
            "--use-service-account-credentials=true",
            f"--node-monitor-grace-period={self.node_monitor_grace_period}",
        ]


__all__ = [
    "ControlPlane",
    "HarnessError",
    "KeyPair",
    "KubeControllerManager",
    "KubeScheduler",
    "wait_for",
]
