"""Publishing one node's state to the API server: ResourceSlices, NodeDevices, node labels.

`NodePublisher.sync(discovery, devices)` is called once per discovery pass. For each of the
three it reads the live object(s), compares with what this pass wants and writes only what
differs, so a pass over an unchanged node sends no write at all — also right after a restart,
since every object has a deterministic name and the builders emit the API server's canonical
forms. A part whose API call fails is logged and reported in `SyncResult.errors`; the other
parts still go ahead, and the next pass retries (nothing is cached between passes except what
the server was seen to rewrite, so a transient error never leaves stale state behind).

ResourceSlices: when only some of the pool's slices are missing (kubelet deletes a node's
slices at start-up and 30 s after a plugin goes away) and the rest still match, the missing
ones are recreated at the current pool generation; any other difference rewrites the whole
pool at generation + 1, as the API requires. Slices of this driver and node that the current
plan does not name are deleted.

NodeDevices: written when the record differs. A part whose enumeration failed is the previous
record (discovery keeps it); with no previous record at all the live object's part is kept,
and with no live object either nothing is written — an empty list would claim the node has
no interfaces, which a failed read cannot support.

Node labels (fabricdra.io/): every desired key is set; a key under `fabricdra.io/rdma.` or
`fabricdra.io/fabric.` that is no longer desired is removed, except when any enumeration failed
in this pass (then nothing is removed) or its inputs could not be read (`labels.unknown`).
Other keys, ours or not, are never touched. One merge patch, only when something differs.

Health Events: each pass whose slices are synced, one Event on the Node per device whose health
(or an Unhealthy device's cause) changed since it was last reported (healthevents.py).

Verification gate (when the agent passes a `GateInput`; docs/verification.md): the state is
decided from the last run, the node's fingerprint now and the Node's override annotation (applied
only while it names that fingerprint and has not expired); a node
that is not Verified/Overridden has every device tainted `fabricdra.io/unverified` (or
`verified: false` on the basic model) and no `fabricdra.io/verified` label; the state is written
to the NodeDevices status subresource when it differs. When the Node cannot be read, the
override is unknown, so slices and status are left as published this pass.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from fabricdra.api import labels as label_keys
from fabricdra.api.inventory import Interface, group_accelerators
from fabricdra.api.nodedevices import API_VERSION as ND_API_VERSION
from fabricdra.api.nodedevices import KIND as ND_KIND
from fabricdra.api.nodedevices import NodeDevicesSpec
from fabricdra.api.verification import Verification
from fabricdra.kube.rest import (
    JSON_PATCH,
    NODE_DEVICES,
    NODES,
    SLICES,
    ApiError,
    Conflict,
    Invalid,
    Kind,
)

from . import metrics
from .devices import DeviceInventory
from .discovery.node import Discovery
from .healthevents import HealthEvents
from .kinds import kind_of
from .resourceslices import DRIVER_NAME, ApiFeatures, Gate, build_slices
from .verification.gate import (
    OVERRIDE_ANNOTATION,
    REVERIFY_ANNOTATION,
    GateInput,
    decide,
    gate_of,
    override_from_annotation,
)

log = structlog.get_logger("fabricdra.publisher")


@dataclass
class SyncResult:
    """What one sync wrote, by kind ({"ResourceSlice": 2}: the writes the server accepted, as
    the publisher's `CountingRest` counted them), and what failed, by part."""

    writes: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())

    @property
    def ok(self) -> bool:
        return not self.errors


SLICE_ATTEMPTS = 3  # list-and-write rounds per pass when a slice write conflicts


class NodePublisher:
    def __init__(
        self,
        api: Any,
        node_name: str,
        *,
        driver_name: str = DRIVER_NAME,
        features: ApiFeatures | None = None,
        list_attributes: bool = False,
        evict_on_fatal: bool = False,
    ) -> None:
        """`features` None: chosen from the server's version on the first sync (1.36+ →
        the current model, older → basic), with `list_attributes` (DRAListTypeAttributes,
        which the version does not tell); pass one to override (docs/attributes.md)."""
        self.list_attributes = list_attributes
        self.evict_on_fatal = evict_on_fatal  # --evict-on-fatal: fatal faults taint NoExecute
        # Every write is counted by the REST layer (and fed to the metric) in one place.
        self.rest = metrics.counting_rest(api)
        self.node_name = node_name
        self.driver = driver_name
        self.features = features
        self._warned_dynamic_mig = False
        # Slices the server stored differently from what we sent (e.g. a field its feature
        # gates drop): slice name -> (what we sent, what it kept), both without generation.
        # Without this, such a field would read as a change on every pass, forever.
        self._accepted: dict[str, tuple[Any, Any]] = {}
        self._warned_rewrite = False
        # The gate state the last sync applied (None: no gate in use, or not decided yet).
        self.verification: Verification | None = None
        # One Event on the Node per device health change (healthevents.py).
        self.health_events = HealthEvents(self.rest, node_name, driver_name)

    # -- one pass ------------------------------------------------------------------------

    def sync(
        self,
        discovery: Discovery,
        devices: DeviceInventory,
        verification: GateInput | None = None,
    ) -> SyncResult:
        """`verification` None: no gate (devices offered as they are); the agent always
        passes one."""
        result = SyncResult()
        before = self.rest.writes()
        try:
            self._sync(discovery, devices, verification, result)
        finally:
            result.writes = _writes_since(before, self.rest.writes())
        return result

    def _sync(
        self,
        discovery: Discovery,
        devices: DeviceInventory,
        verification: GateInput | None,
        result: SyncResult,
    ) -> None:
        node: dict[str, Any] | None = None
        try:
            node = self.rest.get_or_none(NODES, self.node_name)
        except Exception as e:  # transient API errors: logged, retried next pass
            self._failed(result, "Node", e)
        owner = _owner(node) if node else None
        state: Verification | None = None
        if verification is not None and node is not None:
            annotations = node.get("metadata", {}).get("annotations") or {}
            override = override_from_annotation(annotations.get(OVERRIDE_ANNOTATION))
            state = decide(verification.run, verification.fingerprint, override)
            if state.overrideIgnored and (
                self.verification is None
                or self.verification.overrideIgnored != state.overrideIgnored
            ):  # said once per change, not every pass; the status records it too
                log.warning(
                    "verification override not applied",
                    node=self.node_name,
                    why=state.overrideIgnored,
                )
            self.verification = state
        gate_unknown = verification is not None and state is None

        if gate_unknown:
            log.error("node unreadable: verification override unknown; slices left as published")
        elif discovery.interfaces is None or discovery.accelerators is None:
            # Enumeration failed with no earlier record to keep: the inventory is not an
            # empty one, so the published slices stay as they are.
            log.error("slices left as published: enumeration failed", failures=discovery.failures)
        else:
            gate = gate_of(state)
            # Events first: a restarted agent learns what was last reported from the slices
            # as they stand, before this pass rewrites them.
            if node is not None:
                self._guard(result, "Event", lambda: self.health_events.sync(devices, node))
            self._guard(result, "ResourceSlice", lambda: self._sync_slices(devices, owner, gate))
        self._guard(
            result, ND_KIND, lambda: self._sync_node_devices(discovery, devices, owner, state)
        )
        if node is not None:
            self._guard(result, "Node", lambda: self._sync_labels(discovery, node, state))
        elif "Node" not in result.errors:
            result.errors["Node"] = f"node {self.node_name} not found: labels not applied"
            log.error("node not found; labels not applied", node=self.node_name)

    def _guard(self, result: SyncResult, kind: str, part: Any) -> None:
        try:
            part()
        except Exception as e:  # one failing part must not stop the others
            self._failed(result, kind, e)

    def _failed(self, result: SyncResult, kind: str, e: Exception) -> None:
        message = _describe(e)
        result.errors[kind] = message
        log.error(
            "publishing failed; will retry next pass", kind=kind, node=self.node_name, error=message
        )

    def recorded_verification(self) -> Verification | None:
        """The verification state recorded in this node's NodeDevices status (None: none, or
        unreadable), so a restarted agent does not forget a run it already recorded."""
        live = self.rest.get_or_none(NODE_DEVICES, self.node_name)
        recorded = ((live or {}).get("status") or {}).get("verification")
        if recorded is None:
            return None
        try:
            return Verification.model_validate(recorded)
        except ValueError as e:
            log.warning("recorded verification unreadable; verifying afresh", error=str(e))
            return None

    def clear_reverify(self, value: str) -> None:
        """Remove the annotation once its run is done — only if it still holds the request
        that run answered (a JSON patch's test: a newer request stays for the next pass)."""
        path = "/metadata/annotations/" + REVERIFY_ANNOTATION.replace("~", "~0").replace("/", "~1")
        self.rest.patch(
            NODES,
            self.node_name,
            [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}],
            content_type=JSON_PATCH,
        )

    # -- ResourceSlices -------------------------------------------------------------------

    def _features(self) -> ApiFeatures:
        if self.features is None:
            version = self.rest.call("GET", "/version")
            self.features = replace(
                ApiFeatures.for_server_version(version["major"], version["minor"]),
                list_attributes=self.list_attributes,
            )
            log.info(
                "resource API model chosen from the server version",
                model=self.features.model,
                version=version.get("gitVersion"),
            )
        return self.features

    def _sync_slices(
        self,
        devices: DeviceInventory,
        owner: dict[str, Any] | None,
        gate: Gate | None = None,
    ) -> None:
        """Bring the pool to the desired slices. A conflict (409: someone else wrote a slice
        since we listed them, e.g. kubelet's wipe or another pod of ours during a rolling
        update) midway through a rewrite would leave slices of two generations until the
        next pass: the pass lists again and finishes the rewrite at once instead."""
        for attempt in range(1, SLICE_ATTEMPTS + 1):
            try:
                self._sync_slices_once(devices, owner, gate)
                return
            except ApiError as e:
                if self._lists_refused(e):
                    continue  # the same pass again, with scalars
                if not isinstance(e, Conflict) or attempt == SLICE_ATTEMPTS:
                    raise
                log.info("slice write conflicted; listing again", attempt=attempt, error=str(e))

    def _lists_refused(self, e: ApiError) -> bool:
        """A server with DRAListTypeAttributes off drops list values, and then refuses the
        attribute left without one (422 "exactly one value must be specified"): publish the
        scalars from now on, rather than no pool at all, and say so."""
        features = self.features
        if features is None or not features.list_attributes:
            return False
        if not isinstance(e, Invalid) or "exactly one value must be specified" not in e.message:
            return False
        log.error(
            "--list-type-attributes: the API server refuses list attributes "
            "(DRAListTypeAttributes is off); publishing single values",
            error=e.message,
        )
        self.features = replace(features, list_attributes=False)
        self.list_attributes = False
        return True

    def _sync_slices_once(
        self,
        devices: DeviceInventory,
        owner: dict[str, Any] | None,
        gate: Gate | None,
    ) -> None:
        features = self._features()
        live_list = self.rest.list(
            SLICES, field_selector=f"spec.nodeName={self.node_name},spec.driver={self.driver}"
        )
        live = {s["metadata"]["name"]: s for s in live_list.get("items", [])}
        plan = build_slices(
            devices,
            self.node_name,
            driver=self.driver,
            features=features,
            gate=gate,
            evict_on_fatal=self.evict_on_fatal,
        )
        for device, omitted in plan.omitted.items():
            log.warning("attributes omitted: over the API's limits", device=device, omitted=omitted)
        if plan.dropped_dynamic_mig and not self._warned_dynamic_mig:
            self._warned_dynamic_mig = True  # once: the model does not change while we run
            log.warning(
                "--dynamic-mig ignored: the API server has no partitionable devices "
                "(Kubernetes 1.36+ needed); offering the MIG instances that exist (static MIG)",
                model=features.model,
                left_out=len(plan.dropped_dynamic_mig),
            )
        desired = {s["metadata"]["name"]: s for s in plan.slices}

        generations = {int(s["spec"]["pool"].get("generation", 0)) for s in live.values()}
        current = max(generations, default=0)
        matching = {
            name
            for name, s in desired.items()
            if name in live and self._same(name, s["spec"], live[name]["spec"])
        }
        extra = set(live) - set(desired)
        if matching == set(desired) and len(generations) == 1 and not extra:
            return  # nothing changed
        if matching == set(live) and len(generations) <= 1 and not extra:
            generation = current  # only missing slices: recreate them into the same generation
        else:
            generation = current + 1 if live else 0

        for name, s in desired.items():
            s["spec"]["pool"]["generation"] = generation
            if name in live and name in matching and generation == current:
                continue
            body = copy.deepcopy(s)
            if owner:
                body["metadata"]["ownerReferences"] = [owner]
            if name in live:
                _keep_taint_times(body["spec"], live[name]["spec"])
                body["metadata"]["resourceVersion"] = live[name]["metadata"]["resourceVersion"]
                stored = self.rest.replace(SLICES, name, body)
            else:
                stored = self.rest.create(SLICES, body)
            self._remember(name, body["spec"], stored["spec"])
        for name in sorted(extra):
            self.rest.delete(SLICES, name)  # already gone is fine
            self._accepted.pop(name, None)

    def _same(self, name: str, desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
        want, have = _comparable(desired), _comparable(live)
        _keep_taint_times(want, have)
        return want == have or self._accepted.get(name) == (want, have)

    def _remember(self, name: str, sent: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        want, have = _comparable(sent), _comparable(stored)
        _keep_taint_times(want, have)  # the server stamping a taint's time is no rewrite
        if want == have:
            self._accepted.pop(name, None)
            return
        self._accepted[name] = (want, have)
        if not self._warned_rewrite:
            self._warned_rewrite = True
            log.warning(
                "the API server stored the ResourceSlice differently from what was sent; "
                "a feature gate may be off (see --resource-model)",
                slice=name,
            )

    # -- NodeDevices ----------------------------------------------------------------------

    def recorded_interfaces(self) -> list[Interface] | None:
        """The interfaces of the live NodeDevices record (None: no record, or unreadable):
        what a restarted plugin seeds its link history from, so a failure's first-seen time
        survives the restart."""
        spec = _parse_spec(self.rest.get_or_none(NODE_DEVICES, self.node_name))
        return None if spec is None else spec.interfaces

    def _sync_node_devices(
        self,
        discovery: Discovery,
        devices: DeviceInventory,
        owner: dict[str, Any] | None,
        verification: Verification | None = None,
    ) -> None:
        live = self._sync_node_devices_spec(discovery, devices, owner)
        if live is not None and verification is not None:
            self._sync_verification(live, verification)

    def _sync_verification(self, live: Mapping[str, Any], verification: Verification) -> None:
        """The gate state into the status subresource, only when it differs."""
        recorded = (live.get("status") or {}).get("verification")
        try:
            same = recorded is not None and Verification.model_validate(recorded) == verification
        except ValueError:
            same = False  # unreadable: rewritten
        if same:
            return
        # A merge patch of the whole record: a field now None is sent as null and removed.
        self.rest.patch(
            NODE_DEVICES,
            self.node_name,
            {"status": {"verification": verification.model_dump(mode="json")}},
            sub="status",
        )
        log.info("verification state recorded", node=self.node_name, state=verification.state)

    def _sync_node_devices_spec(
        self, discovery: Discovery, devices: DeviceInventory, owner: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Write the spec when it differs; returns the object as stored (None: none)."""
        live = self.rest.get_or_none(NODE_DEVICES, self.node_name)
        live_spec = _parse_spec(live)
        spec = node_devices_spec(discovery, devices, live_spec)
        if spec is None:
            log.error(
                "no inventory record to publish yet: enumeration failed",
                failures=discovery.failures,
            )
            return None
        if live_spec == spec:
            return live
        body: dict[str, Any] = {
            "apiVersion": ND_API_VERSION,
            "kind": ND_KIND,
            "metadata": {"name": self.node_name},
            "spec": spec.model_dump(mode="json"),
        }
        if owner:
            body["metadata"]["ownerReferences"] = [owner]
        if live is None:
            stored = self.rest.create(NODE_DEVICES, body)
        else:
            body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            stored = self.rest.replace(NODE_DEVICES, self.node_name, body)
        return stored

    # -- node labels ----------------------------------------------------------------------

    def _sync_labels(
        self,
        discovery: Discovery,
        node: Mapping[str, Any],
        verification: Verification | None = None,
    ) -> None:
        live = node.get("metadata", {}).get("labels") or {}
        desired = dict(discovery.labels.desired)
        if verification is not None and verification.offered:
            desired[label_keys.VERIFIED] = "true"
        patch = label_patch(
            live,
            desired,
            unknown=discovery.labels.unknown,
            enumeration_failed=bool(discovery.failures),
        )
        if verification is not None and not verification.offered and label_keys.VERIFIED in live:
            patch[label_keys.VERIFIED] = None  # the gate closed: never left standing
        if not patch:
            return
        self.rest.patch(NODES, self.node_name, {"metadata": {"labels": patch}})
        log.info("node labels updated", node=self.node_name, changes=patch)


def node_devices_spec(
    discovery: Discovery, devices: DeviceInventory, live: NodeDevicesSpec | None
) -> NodeDevicesSpec | None:
    """The NodeDevices record of this pass: discovery's interfaces and accelerators (a part
    whose enumeration failed: the live record's; None where there is none to keep) and the
    offered devices neither holds (`DeviceKind.adapter`: EFA), so every published device is
    in the record."""
    interfaces = discovery.interfaces
    accelerators = discovery.accelerators
    groups = group_accelerators(accelerators) if accelerators is not None else None
    if interfaces is None or groups is None:
        if live is None:
            return None
        interfaces = interfaces if interfaces is not None else live.interfaces
        groups = groups if groups is not None else live.groups
    adapters = [ep for d in devices if (ep := kind_of(d).adapter(d)) is not None]
    adapters.sort(key=lambda ep: (ep.pciBusId or "", ep.rdmaDevice or ""))
    return NodeDevicesSpec(interfaces=interfaces, groups=groups, adapters=adapters)


def label_patch(
    live: Mapping[str, str],
    desired: Mapping[str, str],
    *,
    unknown: frozenset[str] | set[str] = frozenset(),
    enumeration_failed: bool = False,
) -> dict[str, str | None]:
    """The merge patch that takes the node's labels to `desired` (None = remove the key)."""
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if live.get(k) != v}
    if enumeration_failed:
        return patch  # deleting on a failed read claims what the read could not support
    for key in live:
        if (
            key.startswith(label_keys.MANAGED_PREFIXES)
            and key not in desired
            and key not in unknown
        ):
            patch[key] = None
    return patch


def _writes_since(
    before: Mapping[tuple[str, str], int], after: Mapping[tuple[str, str], int]
) -> dict[str, int]:
    """Writes counted between two readings of the counter, by kind name."""
    out: dict[str, int] = {}
    for (plural, verb), n in after.items():
        grew = n - before.get((plural, verb), 0)
        if grew:
            name = metrics.kind_name(Kind("", "", plural, False))
            out[name] = out.get(name, 0) + grew
    return out


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(spec))
    pool = dict(out.get("pool", {}))
    pool.pop("generation", None)
    out["pool"] = pool
    return out


def _keep_taint_times(want: dict[str, Any], have: Mapping[str, Any]) -> None:
    """A taint we send without a time gets one from the server: keep that time from then on
    (a taint that comes back after healing gets a fresh one)."""
    stamped = {
        (d["name"], t["key"], t.get("value"), t["effect"]): t.get("timeAdded")
        for d in have.get("devices", []) or []
        for t in d.get("taints", []) or []
    }
    for d in want.get("devices", []) or []:
        for t in d.get("taints", []) or []:
            if "timeAdded" not in t:
                time = stamped.get((d["name"], t["key"], t.get("value"), t["effect"]))
                if time is not None:
                    t["timeAdded"] = time


def _parse_spec(obj: Mapping[str, Any] | None) -> NodeDevicesSpec | None:
    if obj is None:
        return None
    try:
        return NodeDevicesSpec.model_validate(obj.get("spec") or {})
    except ValueError as e:
        log.warning("live NodeDevices record unreadable; it will be rewritten", error=str(e))
        return None


def _owner(node: Mapping[str, Any]) -> dict[str, Any]:
    """Owned by the Node: deleting the Node garbage-collects its slices and record."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node["metadata"]["name"],
        "uid": node["metadata"]["uid"],
        "controller": True,
    }


def _describe(e: Exception) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status}: {e.message}" if e.status else f"no response: {e.message}"
    return f"{type(e).__name__}: {e}"
