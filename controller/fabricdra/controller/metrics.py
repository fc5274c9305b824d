"""Prometheus metrics of the ComputeDomain controller (listed in docs/compute-domains.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILE_SECONDS = Histogram(
    "fabricdra_controller_reconcile_seconds",
    "Time of one reconcile pass, by what was reconciled (domain or node).",
    ["target"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "fabricdra_controller_reconcile_errors_total",
    "Reconcile passes that failed and were retried, by target.",
    ["target"],
    registry=REGISTRY,
)
API_WRITES = Counter(
    "fabricdra_controller_api_writes_total",
    "Writes the controller sent to the API server, by kind and verb.",
    ["kind", "verb"],
    registry=REGISTRY,
)
DOMAINS = Gauge(
    "fabricdra_controller_compute_domains",
    "ComputeDomains known to the controller, by Ready condition status.",
    ["ready"],
    registry=REGISTRY,
)
HELD_NODES = Gauge(
    "fabricdra_controller_held_nodes",
    "Nodes currently held by a ComputeDomain.",
    registry=REGISTRY,
)
ADMISSIONS = Counter(
    "fabricdra_controller_admissions_total",
    "Workload claims answered at binding time, by result (admitted or conflict).",
    ["result"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "fabricdra_controller_leader",
    "1 while this replica holds the leader lease.",
    registry=REGISTRY,
)
HEARTBEATS = Counter(
    "fabricdra_controller_heartbeats_total",
    "Report Lease renewals taken without a reconcile (only the Lease's deadline moved).",
    registry=REGISTRY,
)
