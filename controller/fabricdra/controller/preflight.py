"""What the ComputeDomain controller needs from the API server, checked once at start.

ComputeDomains rest on two features of `resource.k8s.io/v1` that are beta and on by default
only from Kubernetes 1.36 (alpha and off in 1.34 and 1.35):

- DRAConsumableCapacity: `allowMultipleAllocations`, so every claim of a domain on a node
  shares the node's one channel device;
- DRADeviceBindingConditions: `bindsToNode`, `bindingConditions`, `bindingFailureConditions`,
  so a workload's pod waits at binding until the controller admits its claim.

An API server whose gate is off silently drops such a field from what it stores: the channel
device would then be handed to one claim only, and pods would bind before admission, with
nothing failing loudly. So the controller asks the server itself, not its version: the API
group is served (discovery of `resource.k8s.io/v1` with the resources it uses), and a
server-side dry-run create of the ResourceSlice it writes for a node keeps every one of those
fields. The version is read for the message. Any failure stops the controller with one error
naming what is off and why (docs/install.md, "Kubernetes versions"): a controller without
these features could only do harm, and the chart refuses `computeDomains.enabled=true` below
1.36 before anything is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fabricdra.kube.rest import SLICES, NotFound

from . import objects

FLOOR = (1, 36)  # the first release with both gates on by default
GROUP_VERSION = "resource.k8s.io/v1"
RESOURCES = ("resourceslices", "resourceclaims", "resourceclaimtemplates", "deviceclasses")
# Each device field the controller's node slice uses, and the feature gate that keeps it.
FIELDS = {
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
}
PROBE_NODE = "fabricdra-preflight-probe"  # never created: the write is a dry run


@dataclass(frozen=True)
class Preflight:
    version: str  # the server's gitVersion, e.g. v1.36.3 (`v1.36.3 emulating 1.34`)
    problems: list[str] = field(default_factory=list)
    # Older than FLOOR: where nothing is missing, the gates were turned on by hand.
    old: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def message(self) -> str:
        if self.ok:
            how = " (feature gates on by hand)" if self.old else ""
            return f"Kubernetes {self.version}: every API feature ComputeDomains need is on{how}"
        floor = f"{FLOOR[0]}.{FLOOR[1]}"
        return (
            f"ComputeDomains cannot run on this cluster (Kubernetes {self.version}): "
            + "; ".join(self.problems)
            + f". They need Kubernetes {floor} or later (or 1.34/1.35 with the feature gates "
            "DRAConsumableCapacity and DRADeviceBindingConditions on in kube-apiserver, "
            "kube-scheduler, kube-controller-manager and kubelet); otherwise install with "
            "computeDomains.enabled=false"
        )


def below_floor(major: str, minor: str) -> bool:
    """Whether a `/version` major/minor is older than the floor (a minor such as "35+" from
    some distributions is read as 35); an unreadable version is not judged here."""
    digits = "".join(ch for ch in minor if ch.isdigit())
    if not major.strip().isdigit() or not digits:
        return False
    return (int(major), int(digits)) < FLOOR


def check(rest: Any) -> Preflight:
    """Ask the server (`rest`: fabricdra.kube.rest.Rest). API errors other than the answers
    judged here propagate: a server that cannot be asked cannot be trusted either."""
    v = rest.call("GET", "/version")
    version = str(v.get("gitVersion") or f"{v.get('major')}.{v.get('minor')}")
    major, minor = str(v.get("major")), str(v.get("minor"))
    # A server run with --emulated-version (compatibility versions, KEP-4330) keeps its binary's
    # gitVersion, major and minor but serves the emulated release's API and default feature
    # gates: judge it as that release, and say so.
    emulated = (str(v.get("emulationMajor") or ""), str(v.get("emulationMinor") or ""))
    if all(emulated) and emulated != (major, minor):
        major, minor = emulated
        version += f" emulating {major}.{minor}"
    old = below_floor(major, minor)
    try:
        served = {r.get("name") for r in rest.call("GET", f"/apis/{GROUP_VERSION}")["resources"]}
    except NotFound:
        return Preflight(version, [f"the API server does not serve {GROUP_VERSION} (DRA)"], old)
    missing = [r for r in RESOURCES if r not in served]
    if missing:
        return Preflight(version, [f"{GROUP_VERSION} does not serve {', '.join(missing)}"], old)
    dropped = _dropped_fields(rest)
    problems = []
    for gate in dict.fromkeys(FIELDS[f] for f in dropped):
        fields = ", ".join(f for f in dropped if FIELDS[f] == gate)
        problems.append(f"feature gate {gate} is off: the API server drops {fields}")
    return Preflight(version, problems, old)


def _dropped_fields(rest: Any) -> list[str]:
    """The FIELDS a dry-run create of the controller's node slice does not keep."""
    body = objects.node_slice(
        PROBE_NODE, "00000000-0000-0000-0000-000000000000", "free", "probe", 0
    )
    body["metadata"].pop("name")
    body["metadata"]["generateName"] = "fabricdra-preflight-"
    stored = rest.call("POST", SLICES.path(), body=body, query={"dryRun": "All"})
    sent = {d["name"]: d for d in body["spec"]["devices"]}
    kept = {d["name"]: d for d in stored.get("spec", {}).get("devices", []) or []}
    dropped = []
    for name in FIELDS:
        used = [n for n, d in sent.items() if name in d]
        if any(name not in kept.get(n, {}) for n in used):
            dropped.append(name)
    return dropped
