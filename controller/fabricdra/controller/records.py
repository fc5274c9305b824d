"""Decisions written to the API before anything depends on them.

A decision the controller acts on (a domain's channel, a gang's placement, the fabric domain
an elastic domain's first admission fixes) is written into the domain's status first; only
then is a claim template created from it or a claim admitted under it. A controller that
dies in between leaves either nothing (the decision is made again, nothing depends on it)
or the record (the next leader reads it): never an object or an admission whose decision
exists only in the dead process's memory. See docs/compute-domains.md, "What survives what".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabricdra.api.jsontypes import JSON
from fabricdra.kube.patches import conditional
from fabricdra.kube.rest import COMPUTE_DOMAINS

if TYPE_CHECKING:
    from .deps import Api
    from .ownership import Ownership


class NotRecorded(Exception):
    """The decision could not be written (the domain is gone or says otherwise): whatever
    depends on it must not happen now; the caller's key is retried."""


def record_fabric(
    rest: Api, ownership: Ownership, uid: str, fabric: str, *, replace: bool = False
) -> None:
    """Write `fabric` into the domain's `status.fabricDomain`, read fresh from the API and
    written conditionally on that read (a concurrent status write makes this one fail with
    409 instead of being overwritten). `replace`: a recorded other fabric domain may be
    replaced (a gang's placement moving); else a different record is refused. Raises
    ApiError or NotRecorded when the record is not there on return."""
    key = ownership.key_of(uid)
    if not key:
        raise NotRecorded(f"ComputeDomain {uid} is not known (yet)")
    namespace, name = key.split("/", 1)
    obj = rest.get(COMPUTE_DOMAINS, name, namespace)
    meta = obj["metadata"]
    if meta.get("uid") != uid or meta.get("deletionTimestamp"):
        raise NotRecorded(f"ComputeDomain {key} ({uid}) is gone or being deleted")
    recorded = (obj.get("status") or {}).get("fabricDomain") or ""
    if recorded == fabric:
        return
    if recorded and not replace:
        raise NotRecorded(
            f"ComputeDomain {key} is recorded in fabric domain {recorded}, not {fabric}"
        )
    patch = conditional(meta["resourceVersion"], {"status": {"fabricDomain": fabric}})
    rest.patch(COMPUTE_DOMAINS, name, patch, namespace, sub="status")


def decisions_patch(
    status: JSON,
    resource_version: str,
    channel: int,
    fabric: str | None,
    plan: JSON | None = None,
) -> JSON | None:
    """The conditional status patch recording a domain's channel (and a gang's placement,
    `fabric`, or a spanning gang's `plan`: status.placement), or None when the status records
    them already."""
    want: JSON = {}
    if plan is not None and status.get("placement") != plan:
        want["placement"] = plan
    if channel not in (status.get("channels") or []):
        want["channels"] = [channel]
    if fabric and (status.get("fabricDomain") or "") != fabric:
        want["fabricDomain"] = fabric
    if not want:
        return None
    return conditional(resource_version, {"status": want})
