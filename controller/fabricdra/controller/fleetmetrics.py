"""The fleet view as controller metrics, and the one place that reads it from the API.

`read_fleet(rest)` lists ResourceSlices, ResourceClaims, NodeDevices, ComputeDomains and Nodes
and hands them to the pure `fleet.fleet` (`fabricdra fleet`, one answer per run).
`FleetCollector` serves the numbers on the controller's /metrics, computed at scrape time (at
most every `min_interval` seconds, cached in between) from the controller's own informers
(`FleetCaches`): a scrape sends no request to the API server. Listing every slice on each
scrape cost the API server a full LIST, and the controller a second copy of the fleet's
slices, per scrape: about 1.1 GB for one 10,000-node listing, against the controller's 512 Mi
limit. A cache not synced yet, or a read that fails, yields no fleet numbers at all and
`fabricdra_fleet_up 0`: a failed read is never published as zeros.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fabricdra.kube.informer import Informer
from fabricdra.kube.rest import (
    CLAIMS,
    COMPUTE_DOMAINS,
    NODE_DEVICES,
    NODES,
    SLICES,
    Kind,
    NotFound,
    Rest,
)

from . import capacity
from .fleet import STRANDED_REASONS, Fleet, fleet

if TYPE_CHECKING:
    from .manager import Controller

log = structlog.get_logger("fabricdra.fleet")


def _items(rest: Rest, kind: Kind, *, optional: bool = False) -> list[dict[str, Any]]:
    try:
        return list(rest.list(kind).get("items") or [])
    except NotFound:
        if optional:  # the CRD is not installed: there are none
            return []
        raise


def read_fleet(
    rest: Rest, *, require_verified_nodes: bool = False, require_fabric_verified: bool = False
) -> Fleet:
    """`require_verified_nodes`: count a node towards `largestFit` only with the verified label,
    as gang placement does under the controller's `--require-verified-nodes`;
    `require_fabric_verified`: a node of a fabric domain only with the fabric check's label, as
    under the controller's `--fabric-check`."""
    return read_fleet_and_claims(
        rest,
        require_verified_nodes=require_verified_nodes,
        require_fabric_verified=require_fabric_verified,
    )[0]


def read_fleet_and_claims(
    rest: Rest, *, require_verified_nodes: bool = False, require_fabric_verified: bool = False
) -> tuple[Fleet, list[dict[str, Any]]]:
    """`read_fleet`, and the claims it read (`fabricdra fleet --defrag` needs them again)."""
    claims = _items(rest, CLAIMS)
    view = fleet(
        _items(rest, SLICES),
        claims,
        _items(rest, NODE_DEVICES, optional=True),
        _items(rest, COMPUTE_DOMAINS, optional=True),
        _items(rest, NODES),
        require_verified_nodes=require_verified_nodes,
        require_fabric_verified=require_fabric_verified,
    )
    return view, claims


class FleetCaches:
    """The fleet view from the controller's informers: its devices.fabricdra.io slices, every
    claim's allocation and the ComputeDomains (which gang placement reads already), and one
    informer of its own over every Node (the controller's Node cache holds only the
    compute-domain plugin's nodes; the fleet counts every node that publishes devices).
    NodeDevices are not read: the fleet view does not use them (fleet.fleet)."""

    def __init__(
        self,
        controller: Controller,
        *,
        require_verified_nodes: bool = False,
        require_fabric_verified: bool = False,
    ) -> None:
        self.c = controller
        self.require_verified_nodes = require_verified_nodes
        self.require_fabric_verified = require_fabric_verified
        self.nodes = Informer(
            controller.rest,
            NODES,
            resync=controller.config.resync_seconds,
            transform=capacity.node_view,
        )

    def start(self) -> None:
        self.nodes.start()

    def stop(self) -> None:
        self.nodes.stop()

    def read(self) -> Fleet:
        c = self.c
        caches = [c.device_slices, c.allocations, c.domains, self.nodes]
        missing = [i.kind.plural for i in caches if not i.has_synced()]
        if missing:
            raise RuntimeError(f"caches not synced yet: {', '.join(missing)}")
        return fleet(
            c.device_slices.items(),
            c.allocations.items(),
            [],
            c.domains.items(),
            self.nodes.items(),
            require_verified_nodes=self.require_verified_nodes,
            require_fabric_verified=self.require_fabric_verified,
        )


class FleetCollector(Collector):
    def __init__(self, read: Callable[[], Fleet], min_interval: float = 15.0) -> None:
        self.read = read  # normally read_fleet over the controller's API client
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._cached: tuple[float, Fleet | None] = (float("-inf"), None)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # computed at scrape time: nothing to describe at registration

    def _fleet(self) -> Fleet | None:
        with self._lock:
            at, cached = self._cached
            if time.monotonic() - at < self.min_interval:
                return cached
            try:
                current: Fleet | None = self.read()
            except Exception as e:  # the API may be down: say so, publish no numbers
                log.error("fleet view unreadable", error=str(e))
                current = None
            self._cached = (time.monotonic(), current)
            return current

    def collect(self) -> Iterator[Metric]:
        view = self._fleet()
        up = GaugeMetricFamily("fabricdra_fleet_up", "1 when the last fleet listing succeeded.")
        up.add_metric([], 1 if view is not None else 0)
        yield up
        if view is None:
            return
        labels = ["fabric_domain", "device_class"]
        families = {
            name: GaugeMetricFamily(f"fabricdra_devices_{name}", text, labels=labels)
            for name, text in (
                ("published", "Published devices, by fabric domain and device class."),
                ("healthy", "Devices without a health taint or failed link."),
                ("verified", "Devices of verified nodes."),
                ("allocated", "Devices named by a ResourceClaim allocation."),
                ("free", "Devices healthy, verified and not allocated."),
            )
        }
        stranded = GaugeMetricFamily(
            "fabricdra_devices_stranded_gpus",
            "Free GPUs no job can use whole, by fabric domain, device class and reason "
            f"({', '.join(STRANDED_REASONS)}).",
            labels=[*labels, "reason"],
        )
        nodes = GaugeMetricFamily(
            "fabricdra_fabric_domain_nodes", "Nodes per fabric domain.", labels=["fabric_domain"]
        )
        verified_nodes = GaugeMetricFamily(
            "fabricdra_fabric_domain_verified_nodes",
            "Verified nodes per fabric domain.",
            labels=["fabric_domain"],
        )
        largest = GaugeMetricFamily(
            "fabricdra_fabric_domain_largest_fit_nodes",
            "The largest N for which an N-node ComputeDomain fits in the fabric domain now.",
            labels=["fabric_domain"],
        )
        for d in view.domains.values():
            nodes.add_metric([d.name], d.nodes)
            verified_nodes.add_metric([d.name], d.verifiedNodes)
            largest.add_metric([d.name], d.largestFit)
            for cls, c in d.classes.items():
                for name, family in families.items():
                    family.add_metric(
                        [d.name, cls], getattr(c, "total" if name == "published" else name)
                    )
                for reason, n in c.stranded.items():
                    stranded.add_metric([d.name, cls, reason], n)
        yield from families.values()
        yield from (stranded, nodes, verified_nodes, largest)
        yield from tier_metrics(view)


def tier_metrics(view: Fleet) -> list[GaugeMetricFamily]:
    """The per-tier rows (`Fleet.tiers`) as gauges labelled `tier` (tier-1, tier-2, tier-3,
    nvlink) and `name` (the switch's tier label value, or the NVLink domain). Cardinality: one
    series per switch and NVLink domain per gauge, bounded by the fabric's size, not by jobs
    or devices (bench/scale.py's 5,000 nodes: 157 leaves, 20 spines, 5 cores and 278 NVL72
    domains, 460 rows, 1,840 series)."""
    labels = ["tier", "name"]
    gauges = {
        "nodes": GaugeMetricFamily(
            "fabricdra_tier_nodes", "Nodes under the switch or NVLink domain.", labels=labels
        ),
        "freeGpus": GaugeMetricFamily(
            "fabricdra_tier_free_gpus",
            "Free (healthy, verified, unallocated) GPUs under the switch or NVLink domain.",
            labels=labels,
        ),
        "largestGang": GaugeMetricFamily(
            "fabricdra_tier_largest_gang_nodes",
            "The largest gang (whole free nodes over every NVLink domain under it, less what "
            "placed gangs still expect) that fits under the switch now.",
            labels=labels,
        ),
        "largestSegment": GaugeMetricFamily(
            "fabricdra_tier_largest_segment_nodes",
            "The largest NVLink-local segment (whole free nodes inside one NVLink domain) "
            "that fits under the switch now.",
            labels=labels,
        ),
    }
    for row in view.tiers():
        for key, gauge in gauges.items():
            gauge.add_metric([row["tier"], row["name"]], row[key])
    return list(gauges.values())


def register(
    controller: Controller,
    registry: CollectorRegistry,
    min_interval: float = 15.0,
    *,
    require_verified_nodes: bool = False,
    require_fabric_verified: bool = False,
) -> FleetCaches:
    """Serve the fleet view on `registry` from `controller`'s caches (started with it, leader
    or not: a standby serves the same numbers). Returns the caches (stop() ends the Node
    informer it adds)."""
    caches = FleetCaches(
        controller,
        require_verified_nodes=require_verified_nodes,
        require_fabric_verified=require_fabric_verified,
    )
    caches.start()
    registry.register(FleetCollector(caches.read, min_interval))
    return caches
