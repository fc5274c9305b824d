"""Prometheus metrics of the node agent. One registry per process, served by the agent.

Names follow Prometheus conventions (`_seconds`, `_total`); every metric is listed in
docs/kubelet-plugin.md.
"""

from __future__ import annotations

import errno
import threading
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from fabricdra.kube.rest import CountingRest, Kind

log = structlog.get_logger("fabricdra.agent")

if TYPE_CHECKING:
    from fabricdra.kubeletplugin.kubelet.server import ClaimMetrics

REGISTRY = CollectorRegistry(auto_describe=True)

# Prepare/unprepare run in milliseconds; the buckets resolve the 20 ms goal.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

PREPARE_SECONDS = Histogram(
    "fabricdra_prepare_seconds",
    "Time to prepare one ResourceClaim (NodePrepareResources, per claim).",
    ["driver"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
UNPREPARE_SECONDS = Histogram(
    "fabricdra_unprepare_seconds",
    "Time to unprepare one ResourceClaim (NodeUnprepareResources, per claim).",
    ["driver"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PREPARE_ERRORS = Counter(
    "fabricdra_prepare_errors_total",
    "Claims whose prepare failed.",
    ["driver"],
    registry=REGISTRY,
)
UNPREPARE_ERRORS = Counter(
    "fabricdra_unprepare_errors_total",
    "Claims whose unprepare failed.",
    ["driver"],
    registry=REGISTRY,
)
DISCOVERY_SECONDS = Histogram(
    "fabricdra_discovery_pass_seconds",
    "Wall time of one discovery pass over sysfs (and NVML).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
API_WRITES = Counter(
    "fabricdra_api_writes_total",
    "Writes the API server accepted from the node agent, by object kind and verb "
    "(create, update, patch, delete).",
    ["kind", "verb"],
    registry=REGISTRY,
)
# The `kind` label keeps the kind names it always had (the controller's counter says plurals).
_KIND_NAMES = {
    "resourceslices": "ResourceSlice",
    "nodedevices": "NodeDevices",
    "nodes": "Node",
    "events": "Event",
}


def kind_name(kind: Kind) -> str:
    return _KIND_NAMES.get(kind.plural, kind.plural)


def _count_write(kind: Kind, verb: str) -> None:
    API_WRITES.labels(kind=kind_name(kind), verb=verb).inc()


def counting_rest(api_client: Any) -> CountingRest:
    """The node agent's REST layer: every write the server accepted is counted here, once
    (kube/rest.py `CountingRest`, as the controller does), into `fabricdra_api_writes_total`."""
    return CountingRest(api_client, on_write=_count_write)


DEVICES = Gauge(
    "fabricdra_devices",
    "Devices published in this node's ResourceSlices, by type and health.",
    ["type", "health"],
    registry=REGISTRY,
)


def claim_metrics() -> ClaimMetrics:
    """The claim metrics above, for `PluginServer(metrics=...)`: the shared server records
    into the collectors its driver's process gives it."""
    from fabricdra.kubeletplugin.kubelet.server import ClaimMetrics

    return ClaimMetrics(PREPARE_SECONDS, UNPREPARE_SECONDS, PREPARE_ERRORS, UNPREPARE_ERRORS)


def serve(port: int, address: str, ended: threading.Event, servers: list[Any]) -> None:
    """Open the metrics port, retrying while it is taken: in the host network, a rolling
    update's new pod starts while the old pod still holds the port (maxSurge), and
    serves it once the old pod has exited."""
    warned = False
    while not ended.is_set():
        try:
            http, _ = start_http_server(port, address, registry=REGISTRY)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                log.error("metrics port cannot be opened", port=port, error=str(e))
                return
            if not warned:
                log.warning("metrics port in use (another pod?); retrying", port=port)
                warned = True
            ended.wait(1.0)
            continue
        servers.append(http)
        log.info("metrics served", port=port)
        return
