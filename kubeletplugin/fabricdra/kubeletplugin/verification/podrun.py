"""The verification pod: where the node agent runs the active probes (docs/verification.md,
"The verification pod").

The agent's own image carries no GPU or RDMA tools, and should not: they are large, CUDA-bound
and versioned with the driver. So the agent starts one pod on its own node from the chart's
`verification.image`, which runs the probe script (`active.script`: POSIX `sh` and coreutils'
`timeout` are all it needs from the image) and prints the outputs on stdout; the agent reads
the pod's log, judges it as it would a local run, and deletes the pod.

The pod: `nodeName` (no scheduler: the node's devices are tainted while it is unverified, and
the pod takes no claim — the node is idle, `Agent._busy`), `hostNetwork` (the RDMA loopback
uses the host's interfaces and their GIDs), privileged (the host's /dev/nvidia* and
/dev/infiniband/*), `restartPolicy: Never`, `activeDeadlineSeconds` the run's limit, tolerating
every taint (a node being verified may be cordoned or tainted), no service-account token.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from fabricdra.kube.rest import PODS, ApiError, NotFound, Rest

log = structlog.get_logger("fabricdra.verification")

COMPONENT = "verification"
NODE_LABEL = "fabricdra.io/verification-node"
START_SECONDS = 300.0  # an image pull and a container start, on top of the run's own limit


def pod_name(node: str) -> str:
    """`fabricdra-verify-<hash of the node>-<random>`: within 63 characters for any node."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"fabricdra-verify-{digest}-{uuid.uuid4().hex[:6]}"


def pod_manifest(
    name: str,
    namespace: str,
    node: str,
    image: str,
    script: str,
    deadline: float,
    *,
    runtime_class: str | None = None,
    pull_secrets: tuple[str, ...] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "activeDeadlineSeconds": int(deadline) + 1,
        "terminationGracePeriodSeconds": 5,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "probes",
                "image": image,
                "command": ["sh", "-c", script],
                "securityContext": {"privileged": True},
                # NVIDIA's container runtime injects the driver's libraries for these.
                "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
                ],
            }
        ],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "fabricdra",
                "app.kubernetes.io/component": COMPONENT,
                NODE_LABEL: node if len(node) <= 63 else "",
            },
        },
        "spec": spec,
    }


class PodExecutor:
    """Runs the probe script in a pod on `node` and returns its log."""

    def __init__(
        self,
        rest: Rest,
        namespace: str,
        node: str,
        image: str,
        *,
        runtime_class: str | None = None,
        pull_secrets: tuple[str, ...] = (),
        poll_seconds: float = 2.0,
        start_seconds: float = START_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self.node = node
        self.image = image
        self.runtime_class = runtime_class
        self.pull_secrets = pull_secrets
        self.poll_seconds = poll_seconds
        self.start_seconds = start_seconds
        self.sleep = sleep

    def run(self, script: str, timeout: float) -> str:
        """The pod's log once it ended. Raises (the probes are then NotRun, said why) when
        the pod cannot be created or ends without running (image pull, admission)."""
        self._remove_leftovers()
        name = pod_name(self.node)
        body = pod_manifest(
            name,
            self.namespace,
            self.node,
            self.image,
            script,
            timeout,
            runtime_class=self.runtime_class,
            pull_secrets=self.pull_secrets,
        )
        self.rest.create(PODS, body, self.namespace)
        log.info("verification pod started", pod=name, image=self.image)
        try:
            phase, why = self._wait(name, timeout + self.start_seconds)
            if phase not in ("Succeeded", "Failed"):
                raise RuntimeError(f"verification pod {name} did not finish: {why}")
            return self.rest.text(
                PODS.path(self.namespace, name, "log"), query={"container": "probes"}
            )
        finally:
            self._delete(name)

    def _remove_leftovers(self) -> None:
        """Delete this node's verification pods an earlier agent left (it was restarted
        mid-run): their tools would run beside the new run's and both would measure less."""
        selector = f"app.kubernetes.io/component={COMPONENT},{NODE_LABEL}={self.node}"
        for pod in self.rest.list(PODS, self.namespace, label_selector=selector)["items"]:
            name = pod["metadata"]["name"]
            log.info("deleting a verification pod left by an earlier run", pod=name)
            self._delete(name)

    def _delete(self, name: str) -> None:
        try:
            self.rest.call(
                "DELETE",
                PODS.path(self.namespace, name),
                body={"gracePeriodSeconds": 0, "propagationPolicy": "Background"},
            )
        except NotFound:
            pass
        except ApiError as e:
            log.warning("verification pod not deleted", pod=name, error=str(e))

    def _wait(self, name: str, limit: float) -> tuple[str, str]:
        """(phase, why) once the pod ended or `limit` seconds passed."""
        deadline = time.monotonic() + limit
        phase, why = "Pending", "no status yet"
        while True:
            try:
                pod = self.rest.get(PODS, name, self.namespace)
            except NotFound:
                return "Gone", "deleted before it finished"
            status = pod.get("status") or {}
            phase = status.get("phase") or "Pending"
            if phase in ("Succeeded", "Failed"):
                return phase, status.get("reason") or phase
            why = _waiting_reason(status) or phase
            if time.monotonic() >= deadline:
                return phase, f"{why} after {limit:g} s"
            self.sleep(self.poll_seconds)


def _waiting_reason(status: dict[str, Any]) -> str | None:
    """`ErrImagePull: <message>` and the like: why the container has not started."""
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            msg = waiting.get("message")
            return f"{waiting['reason']}: {msg}" if msg else str(waiting["reason"])
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    return None
