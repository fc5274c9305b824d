"""How an IMEX daemon reports to the controller: one Lease per (domain, node) in the driver's
namespace, annotated with its state. Each daemon writes only its own object, and only when its
state changes, so a thousand daemons never contend for one status (the controller folds the
reports into the ComputeDomain's status as its single writer)."""

from __future__ import annotations

from datetime import UTC, datetime

from fabricdra.api import computedomain as cd
from fabricdra.api.rest import LEASES, ApiError, Rest


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
) -> bool:
    """Create or update the report; returns False when it already said exactly this."""
    name = name or lease_name(domain_uid, node)
    annotations = {
        cd.REPORT_READY: "true" if ready else "false",
        cd.REPORT_MESSAGE: message[:1024],
        cd.REPORT_IP: ip,
        cd.REPORT_NODE: node,
    }
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    try:
        live = rest.get(LEASES, name, namespace)
    except ApiError as e:
        if not e.not_found:
            raise
        body = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {cd.DOMAIN_LABEL: domain_uid},
                "annotations": annotations,
            },
            "spec": {"holderIdentity": node, "renewTime": now},
        }
        rest.create(LEASES, body, namespace)
        return True
    if all(live["metadata"].get("annotations", {}).get(k) == v for k, v in annotations.items()):
        return False
    rest.patch(
        LEASES,
        name,
        {"metadata": {"annotations": annotations}, "spec": {"renewTime": now}},
        namespace,
    )
    return True


def delete_report(rest: Rest, namespace: str, domain_uid: str, node: str) -> None:
    rest.delete(LEASES, lease_name(domain_uid, node), namespace)


def host_lease_name(node: str) -> str:
    return f"imex-host-{node}"[:253].rstrip("-.")


def write_host_report(rest: Rest, namespace: str, node: str, *, ready: bool, message: str) -> bool:
    """The node plugin's report on its host's IMEX service (used by host-mode domains)."""
    return write_report(
        rest,
        namespace,
        cd.HOST_REPORT,
        node,
        ready=ready,
        message=message,
        name=host_lease_name(node),
    )
