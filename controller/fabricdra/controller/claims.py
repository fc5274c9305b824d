"""Reading ResourceClaims and Nodes as the controller needs them (pure: dicts in, facts out)."""

from __future__ import annotations

from datetime import datetime

from fabricdra.api import computedomain as cd
from fabricdra.api import labels as node_labels
from fabricdra.api import opaque
from fabricdra.api.jsontypes import JSON

from . import admission

DEVICES_DRIVER = "devices.fabricdra.io"  # the devices plugin (capacity.DRIVER)


def dev_key(d: JSON) -> tuple[str, str, str, str]:
    """The list-map key of `status.devices` (and of allocation results)."""
    return (d.get("driver", ""), d.get("pool", ""), d.get("device", ""), d.get("shareID", ""))


def results(claim: JSON) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def allocated_at(claim: JSON) -> float | None:
    """When the claim was allocated (epoch seconds), from `status.allocation.
    allocationTimestamp` (kube-scheduler writes it with binding conditions on); None when
    the claim does not say. The API keeps whole seconds, so the end of that second: a timer
    from it never runs out before the real allocation time plus its length."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    stamp = allocation.get("allocationTimestamp")
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() + 1.0
    except ValueError:
        return None


def claim_nodes(claim: JSON) -> set[str]:
    """Nodes whose compute-domain devices the claim is allocated."""
    return {r["pool"] for r in results(claim) if r.get("driver") == cd.DRIVER and r.get("pool")}


def device_nodes(claim: JSON) -> set[str]:
    """Pools (nodes) whose devices.fabricdra.io devices the claim is allocated: the GPU room
    it takes (capacity.allocate)."""
    return {
        r["pool"] for r in results(claim) if r.get("driver") == DEVICES_DRIVER and r.get("pool")
    }


def report_node(lease: JSON) -> str:
    """The node a report Lease speaks for (its annotation, else its holder)."""
    meta = lease["metadata"]
    node = meta.get("annotations", {}).get(cd.REPORT_NODE)
    return str(node or (lease.get("spec") or {}).get("holderIdentity") or "")


def _domain_config(claim: JSON) -> JSON | None:
    """The claim's compute-domain configuration (channel or daemon), from its spec: written
    from the domain's template and immutable once the claim exists, unlike its labels."""
    for config in (claim.get("spec") or {}).get("devices", {}).get("config", []) or []:
        found = config.get("opaque") or {}
        params = found.get("parameters")
        if found.get("driver") == cd.DRIVER and isinstance(params, dict):
            return params
    return None


def claim_domain(claim: JSON) -> tuple[str, str]:
    """(UID, namespace) of the ComputeDomain a claim belongs to: what its configuration names.
    The domain label is the claim owner's to edit (stripping it once freed a node and a
    channel under a running pod), so it counts only for a claim without a configuration,
    which the node plugin never prepares; its namespace is then unknown ("")."""
    params = _domain_config(claim)
    if params is not None:
        return str(params.get("domainUID") or ""), str(params.get("namespace") or "")
    return str(claim["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL, "")), ""


def domain_uid(claim: JSON) -> str:
    return claim_domain(claim)[0]


def is_domain_claim(claim: JSON) -> bool:
    """A claim of the compute-domain driver: allocated its devices, configured for it, or
    labelled with a domain."""
    return bool(
        claim_nodes(claim)
        or _domain_config(claim) is not None
        or cd.DOMAIN_LABEL in (claim["metadata"].get("labels") or {})
    )


def claim_view(claim: JSON) -> JSON:
    """What the controller keeps of a ResourceClaim (its informer watches them all, since a
    label no longer says which are the domains'): the whole of a domain's claim, only the
    name of any other (no managed fields either way)."""
    meta = claim["metadata"]
    if is_domain_claim(claim):
        return {**claim, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    keep = ("name", "namespace", "uid", "resourceVersion")
    return {"metadata": {k: meta[k] for k in keep if k in meta}}


def channel_of(claim: JSON) -> int | None:
    """The IMEX channel an allocated workload claim carries in its opaque configuration
    (copied from the domain's template), None for other claims. A configuration that does not
    validate (fabricdra.api.opaque) holds no channel: the node plugin refuses to prepare it with
    the same error, so no workload can use the channel it names."""
    if not results(claim):
        return None
    for config in (claim.get("spec") or {}).get("devices", {}).get("config", []) or []:
        found = config.get("opaque") or {}
        params = found.get("parameters") or {}
        if found.get("driver") == cd.DRIVER and params.get("kind") == cd.OPAQUE_KIND:
            try:
                return opaque.ChannelConfig.validated(params).channel
            except opaque.OpaqueConfigError:
                continue
    return None


def claim_views(
    claim: JSON, node: str, domain_namespaces: dict[str, str]
) -> list[admission.ClaimOnNode]:
    """`domain_namespaces`: domain UID -> its namespace, for the live domains. A claim speaks
    only for a domain of its own namespace: a claim elsewhere that names a domain's UID counts
    as naming no domain, and can neither hold a node for it nor block one. A domain that is
    gone is known by the namespace the claim's configuration names: its admitted claims still
    hold their node (their pods may still run) until they are no longer allocated."""
    meta = claim["metadata"]
    domain, named = claim_domain(claim)
    if domain_namespaces.get(domain, named) != meta["namespace"]:
        domain = ""
    status_ = claim.get("status") or {}
    allocation = status_.get("allocation") or {}
    devices = {dev_key(d): d for d in status_.get("devices", []) or []}
    views = []
    for r in results(claim):
        if r.get("driver") != cd.DRIVER or r.get("pool") != node:
            continue
        if r.get("device") != cd.CHANNEL_DEVICE:
            continue
        conds = {
            c.get("type"): c.get("status")
            for c in devices.get(dev_key(r), {}).get("conditions", []) or []
        }
        if conds.get(cd.ADMITTED_CONDITION) == "True" or not r.get("bindingConditions"):
            state = "admitted"
        elif conds.get(cd.CONFLICT_CONDITION) == "True":
            state = "conflict"
        else:
            state = "pending"
        views.append(
            admission.ClaimOnNode(
                key=f"{meta['namespace']}/{meta['name']}",
                domain=domain,
                state=state,
                since=str(
                    allocation.get("allocationTimestamp") or meta.get("creationTimestamp", "")
                ),
            )
        )
    return views


def node_fabric(node: JSON) -> str:
    return str(node.get("metadata", {}).get("labels", {}).get(node_labels.FABRIC_DOMAIN, ""))


def node_addresses(node: JSON | None) -> set[str]:
    """Every address a Node's status lists (none for an unknown Node)."""
    if node is None:
        return set()
    return {str(a.get("address", "")) for a in node.get("status", {}).get("addresses", []) or []}


def node_ip(node: JSON) -> str:
    addresses = node.get("status", {}).get("addresses", []) or []
    for kind in ("InternalIP", "ExternalIP"):
        for a in addresses:
            if a.get("type") == kind:
                return str(a.get("address", ""))
    return ""
