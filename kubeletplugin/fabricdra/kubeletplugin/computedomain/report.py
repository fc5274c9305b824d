"""How an IMEX daemon reports to the controller: one Lease per (domain, node) in the driver's
namespace, annotated with its state. Each daemon writes only its own object, so a thousand
daemons never contend for one status (the controller folds the reports into the
ComputeDomain's status as its single writer). The annotations change only when the state
does; `spec.renewTime` is also renewed as a heartbeat (like a kubelet's node Lease) when the
report declares `leaseDurationSeconds`: the controller marks a report that misses it silent
(the node may be off)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import LEASES, NotFound, Rest


def lease_name(domain_uid: str, node: str) -> str:
    return f"imex-{domain_uid}-{node}"[:253].rstrip("-.")


def write_report(
    rest: Rest,
    namespace: str,
    domain_uid: str,
    node: str,
    *,
    ready: bool,
    message: str = "",
    ip: str = "",
    name: str | None = None,
    lease_seconds: int | None = None,
    renew: bool = False,
) -> bool:
    """Create or update the report; returns False when it already said exactly this (and
    `renew` is not asked: a heartbeat rewrites renewTime even when nothing else changed).
    `lease_seconds`: the heartbeat promise, `spec.leaseDurationSeconds`."""
    name = name or lease_name(domain_uid, node)
    annotations = {
        cd.REPORT_READY: "true" if ready else "false",
        cd.REPORT_MESSAGE: message[:1024],
        cd.REPORT_IP: ip,
        cd.REPORT_NODE: node,
    }
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec: dict[str, object] = {"renewTime": now}
    if lease_seconds is not None:
        spec["leaseDurationSeconds"] = lease_seconds
    patch = {"metadata": {"annotations": annotations}, "spec": spec}
    live: dict[str, Any] | None = None
    try:
        if renew:  # written whatever it says now: no read first
            rest.patch(LEASES, name, patch, namespace)
            return True
        live = rest.get(LEASES, name, namespace)
    except NotFound:
        pass
    if live is None:
        body: dict[str, Any] = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {cd.DOMAIN_LABEL: domain_uid},
                "annotations": annotations,
            },
            "spec": {"holderIdentity": node, "renewTime": now},
        }
        if lease_seconds is not None:
            body["spec"]["leaseDurationSeconds"] = lease_seconds
        rest.create(LEASES, body, namespace)
        return True
    same = all(live["metadata"].get("annotations", {}).get(k) == v for k, v in annotations.items())
    same_promise = lease_seconds is None or (
        live.get("spec", {}).get("leaseDurationSeconds") == lease_seconds
    )
    if same and same_promise:
        return False
    rest.patch(LEASES, name, patch, namespace)
    return True


def delete_report(rest: Rest, namespace: str, domain_uid: str, node: str) -> None:
    rest.delete(LEASES, lease_name(domain_uid, node), namespace)


def host_lease_name(node: str) -> str:
    return f"imex-host-{node}"[:253].rstrip("-.")


def write_host_report(
    rest: Rest,
    namespace: str,
    node: str,
    *,
    ready: bool,
    message: str,
    lease_seconds: int | None = None,
    renew: bool = False,
) -> bool:
    """The node plugin's report on its host's IMEX service (used by host-mode domains); with
    `lease_seconds` it is also the node's heartbeat, as a managed daemon's report is."""
    return write_report(
        rest,
        namespace,
        cd.HOST_REPORT,
        node,
        ready=ready,
        message=message,
        name=host_lease_name(node),
        lease_seconds=lease_seconds,
        renew=renew,
    )
