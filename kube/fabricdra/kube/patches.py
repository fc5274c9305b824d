"""Typed helpers for the parts of objects fabricdra writes that every writer must get the same
way: a patch made conditional on the version it was computed from, and a status condition.

A merge patch replaces a list whole (finalizers, conditions, a claim's device entries), so one
computed from a stale read must not land: with `metadata.resourceVersion` in the body the API
server refuses it with 409 (`rest.Conflict`) when the object changed since, and the caller
reads again. https://kubernetes.io/docs/reference/using-api/api-concepts/#concurrency-control-and-consistency
"""

from __future__ import annotations

from typing import Literal

from fabricdra.api.jsontypes import JSON

ConditionStatus = Literal["True", "False", "Unknown"]


def conditional(resource_version: str, patch: JSON) -> JSON:
    """`patch`, applied by the server only to the object at `resource_version`."""
    if not resource_version:
        raise ValueError("a conditional patch needs the resourceVersion it was computed from")
    metadata = {**(patch.get("metadata") or {}), "resourceVersion": resource_version}
    return {**patch, "metadata": metadata}


def condition(type_: str, status: ConditionStatus, reason: str, message: str, *, now: str) -> JSON:
    """A metav1.Condition as the API takes it (a domain's, a claim device entry's), new as of
    `now` (RFC 3339)."""
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
