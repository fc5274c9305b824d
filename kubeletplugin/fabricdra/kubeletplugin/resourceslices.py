"""The ResourceSlices a node publishes: a `DeviceInventory` in, `resource.k8s.io/v1` objects out.

Pure and deterministic — the same inventory always gives the same objects, in the same order,
with values already in the API server's canonical form — so the publisher can decide "nothing
changed" by comparing with the live objects, and `fabricdra inventory --node-name` can print
exactly what the plugin would publish.

One pool per node, named after the node. Devices are put in PCI address order (see
`slice_order`) and cut into slices of at most `ApiFeatures.devices_per_slice` (64 where taints
may appear: the API's limit for a slice with a tainted device; 128 otherwise), so a taint
appearing never reshuffles the slices. Slice names are deterministic, `<node>-<driver>-<i>`,
so a restarted plugin finds its own objects.
An empty inventory is still one slice with no devices: a published, complete, empty pool.

Two API models (docs/attributes.md, "Kubernetes versions"):

* **current** (1.36+, default): a shared RDMA endpoint is one device with
  `allowMultipleAllocations: true` and a consumable `holders` capacity (default one per claim,
  at most all of them), so the scheduler counts holders itself; so is a shared GPU
  (`--gpu-shares`), with consumable `memory` and `shares` (gpusharing.py); Unhealthy devices
  carry a `NoSchedule` device taint.
* **basic** (1.34/1.35, where DRAConsumableCapacity and DRADeviceTaints are off by default):
  a shared endpoint is published as `holders` separate devices `<name>-s<k>` (which
  `DeviceInventory.get` resolves back to the endpoint), and no taints are sent (the API server
  would drop the field, and the publisher would then see a difference on every pass); health
  still reaches kubelet through the health stream, the `linkVerdict` attribute and a `health`
  attribute (`Healthy`/`Unhealthy`/`Unknown`) users select on, e.g.
  `device.attributes["devices.fabricdra.io"].health != "Unhealthy"`.

Shared counters (partitionable devices, KEP-4815) are used for dynamic MIG only
(`DeviceConfig.dynamic_mig`, current model): each such GPU has a counter set named after it
(`sharedCounters`, published in a slice of its own, `<node>-<driver>-counters`, since the API
keeps counter sets and the devices that consume them in separate slices of one pool), and its
whole-GPU device and every profile placement `consumesCounters` their memory slices and
compute slices (migprofiles.py), so the scheduler allocates the whole GPU or any mix of
instances that fits, never two overlapping placements. In the basic model (1.34/1.35,
partitionable devices off) the placements that do not exist yet and the dynamic whole GPU are
left out (`SlicePlan.dropped_dynamic_mig`): what remains is static MIG. Every RDMA endpoint is
offered in exactly one mode (the node's), so no two RDMA devices draw on the same hardware.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .devices import Device, DeviceInventory, holder_name
from .kinds import kind_of
from .kinds.base import STANDARD, CounterUse, NumaNodes, Value, Version, causes_value
from .kinds.nvidia import gpusharing

__all__ = ["STANDARD", "Value", "Version"]  # re-exported: callers import them from here

DRIVER_NAME = "devices.fabricdra.io"
API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

# The API's limits (k8s.io/api resource/v1 types.go).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ID_LENGTH = 32  # the C-identifier part of an attribute/capacity name
MAX_STRING_VALUE = 64
MAX_OBJECT_NAME = 253

TAINT_KEY = "fabricdra.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
# Health Unknown informs and blocks nothing (effect None, resource.k8s.io/v1 since 1.35).
UNKNOWN_TAINT_KEY = "fabricdra.io/health-unknown"
INFO_EFFECT = "None"
# Application Xids seen since boot inform too (effect None): `gpu-xid-13.xid-43`.
XID_TAINT_KEY = "fabricdra.io/xid"
# --evict-on-fatal: the Unhealthy taint of a fatal fault evicts running pods (NoExecute).
FATAL_EFFECT = "NoExecute"
# Causes after which the GPU's running work is lost or its memory cannot be trusted: the GPU
# left the bus or NVML cannot reach it, uncorrectable memory (ECC, a failed row remap,
# Xid 48 double-bit ECC, Xid 95 uncontained ECC, Xid 79 fallen off the bus: NVIDIA's Xid
# catalogue, https://docs.nvidia.com/deploy/xid-errors/), and a reset or reboot the driver
# asks for. Pending row remaps, PCIe/NVLink error bursts, other Xids: NoSchedule only.
FATAL_CAUSES = frozenset(
    {
        "lost",
        "unreadable",
        "ecc",
        "row-remap-failed",
        "xid-48",
        "xid-79",
        "xid-95",
        "recovery-gpu-reset",
        "recovery-node-reboot",
        "recovery-drain-and-reset",
        "recovery-bus-reset",
        "recovery-system-reboot",
    }
)
# The verification gate (docs/verification.md): every device of a node that is not verified
# carries this taint (current model) or `verified: false` (basic model, which the DeviceClasses
# require to be true where present).
UNVERIFIED_TAINT_KEY = "fabricdra.io/unverified"
VERIFIED_ATTRIBUTE = "verified"
# What the gate says of the node: offered, or closed with the taint's value as the reason.
Gate = Literal["verified", "unverified", "failed"]

Model = Literal["current", "basic"]


@dataclass(frozen=True)
class ApiFeatures:
    """What the cluster's resource API serves, chosen by `model`:

    current  1.36+ defaults: consumable capacity (allowMultipleAllocations) and device taints.
    basic    1.34/1.35 defaults: neither; plain devices only.
    """

    model: Model = "current"
    # DRAListTypeAttributes (alpha in 1.36, off by default): list attribute values
    # (`--list-type-attributes`); the API server drops them where the gate is off.
    list_attributes: bool = False

    @property
    def consumable_capacity(self) -> bool:
        return self.model == "current"

    @property
    def device_taints(self) -> bool:
        return self.model == "current"

    @property
    def partitionable_devices(self) -> bool:
        return self.model == "current"

    @property
    def devices_per_slice(self) -> int:
        return MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if self.device_taints else MAX_DEVICES

    @classmethod
    def for_server_version(cls, major: str, minor: str) -> ApiFeatures:
        """The model a server's default feature gates support (`/version` major/minor; a
        minor such as "36+" from some distributions is read as 36)."""
        digits = "".join(ch for ch in minor if ch.isdigit())
        if major.strip() != "1" or not digits:
            raise ValueError(
                f"cannot read a Kubernetes version from major={major!r} minor={minor!r}"
            )
        return cls("current" if int(digits) >= 36 else "basic")


@dataclass(frozen=True)
class SlicePlan:
    """The slices for one pool generation, plus what could not be published as asked."""

    slices: list[dict[str, Any]]
    # Attributes left off because their value broke an API limit (device -> attribute -> why):
    # an attribute is omitted rather than truncated, since two truncated values could compare
    # equal and a matchAttribute would then claim a closeness nothing measured.
    omitted: dict[str, dict[str, str]] = field(default_factory=dict)
    # Dynamic-MIG devices left out because the model has no partitionable devices (basic).
    dropped_dynamic_mig: list[str] = field(default_factory=list)


def slice_order(device: dict[str, Any]) -> tuple[int, str, int, str]:
    """Where a published device sits in its pool: by PCI address, then name; devices without
    one last, by name.

    The scheduler's allocator tries a claim's requests in turn and, for each, the pool's
    devices in slice order, evaluating the request's class expression on each (the result is
    kept for one node's allocation only). Bus numbers are handed out depth-first below each
    root port, so in address order a GPU and the NIC on its switch are neighbours: the NIC
    request of a "GPU + NIC on one pciRoot" claim then meets its NIC next to the GPU just
    taken, instead of after every GPU and MIG device of the node (name order), on every node
    the scheduler examines.

    Dynamic MIG placements of one GPU go from the highest start down: the allocator takes the
    first that fits, and the large profiles (4g, 7g) only start at memory slice 0, so small
    instances packed from the top leave room for them (a 3g.40gb then a 4g.40gb both fit)."""
    bus = device["attributes"].get(STANDARD + "pciBusID", {}).get("string")
    start = device["attributes"].get("migPlacementStart", {}).get("int", -1)
    return (0, bus, -start, device["name"]) if bus else (1, "", 0, device["name"])


def slice_name(node_name: str, driver: str, index: int | str) -> str:
    name = f"{node_name}-{driver}-{index}"
    if len(name) <= MAX_OBJECT_NAME:
        return name
    digest = hashlib.sha256(f"{node_name}\0{driver}".encode()).hexdigest()[:16]
    return f"{node_name[: MAX_OBJECT_NAME - 60]}-{digest}-{index}"


def build_slices(
    inventory: DeviceInventory,
    node_name: str,
    *,
    driver: str = DRIVER_NAME,
    features: ApiFeatures = ApiFeatures(),  # frozen: one shared default is safe
    generation: int = 0,
    gate: Gate | None = None,
    evict_on_fatal: bool = False,
) -> SlicePlan:
    """The ResourceSlice objects (plain dicts, wire field names) for this node's pool.
    `gate` None: no verification gate (library use, `fabricdra inventory`).
    `evict_on_fatal` (--evict-on-fatal): fatal faults taint NoExecute."""
    omitted: dict[str, dict[str, str]] = {}
    dropped: list[str] = []
    devices: list[dict[str, Any]] = []
    counter_sets: dict[str, dict[str, Any]] = {}
    for device in inventory.devices:
        kind = kind_of(device)
        if kind.needs_partitionable(device) and not features.partitionable_devices:
            dropped.append(device.name)  # not created yet (or the whole GPU): nothing to offer
            continue
        use = kind.counters(device) if features.partitionable_devices else None
        published = _published(
            device, inventory.shared_holders, features, omitted, use, evict_on_fatal
        )
        devices.extend(_gated(d, gate, features) for d in published)
        if use is not None:
            counter_sets[use.counter_set] = {
                "name": use.counter_set,
                "counters": _counters(dict(use.capacity)),
            }
    devices.sort(key=slice_order)

    per_slice = features.devices_per_slice
    chunks = [devices[i : i + per_slice] for i in range(0, len(devices), per_slice)] or [[]]
    count = len(chunks) + (1 if counter_sets else 0)
    slices = []
    for index, chunk in enumerate(chunks):
        spec = _slice_spec(driver, node_name, generation, count)
        if chunk:
            spec["devices"] = chunk
        slices.append(_slice(slice_name(node_name, driver, index), spec))
    if counter_sets:
        spec = _slice_spec(driver, node_name, generation, count)
        spec["sharedCounters"] = [counter_sets[k] for k in sorted(counter_sets)]
        slices.append(_slice(slice_name(node_name, driver, "counters"), spec))
    return SlicePlan(slices, omitted, dropped)


def _slice_spec(driver: str, node_name: str, generation: int, count: int) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
        "nodeName": node_name,
    }


def _slice(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def _counters(values: dict[str, int]) -> dict[str, Any]:
    return {k: {"value": str(v)} for k, v in sorted(values.items())}


# --- one device ----------------------------------------------------------------------------


def _published(
    device: Device,
    holders: int,
    features: ApiFeatures,
    omitted: dict[str, dict[str, str]],
    use: CounterUse | None = None,
    evict_on_fatal: bool = False,
) -> list[dict[str, Any]]:
    kind = kind_of(device)
    attrs, why = device_attributes(device, features.list_attributes)
    if why:
        omitted[device.name] = why
    capacity: dict[str, Any] = {}
    memory = kind.memory_mib(device)
    if memory is not None:
        capacity["memory"] = {"value": binary_quantity(memory * 1024 * 1024)}

    for name, count in kind.counts(device).items():
        capacity[name] = {"value": str(count)}
    if not features.device_taints:
        # No taints on this model: the health attribute is what a selector can see.
        attrs["health"] = {"string": device.health}
        attrs = dict(sorted(attrs.items()))
    base: dict[str, Any] = {"name": device.name, "attributes": attrs}
    if kind.holders(device) and not features.consumable_capacity:
        return [
            _with_capacity({**base, "name": holder_name(device.name, k)}, capacity)
            for k in range(holders)
        ]
    if kind.holders(device):
        base["allowMultipleAllocations"] = True
        capacity["holders"] = {
            "value": str(holders),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": str(holders)}},
        }
    elif gpusharing.limits(device) and features.consumable_capacity and "memory" in capacity:
        # A shared GPU (gpusharing.py); the basic model has no consumable capacity, so there
        # it stays one claim's.
        base["allowMultipleAllocations"] = True
        shares = gpusharing.limits(device)[gpusharing.SHARES]
        capacity.update(gpusharing.published_capacity(capacity["memory"]["value"], shares))
    out = _with_capacity(base, capacity)
    if use is not None:
        out["consumesCounters"] = [
            {"counterSet": use.counter_set, "counters": _counters(dict(use.consumed))}
        ]
    if features.device_taints:
        taints = _health_taints(device, evict_on_fatal)
        if taints:
            out["taints"] = taints
    return [out]


def _health_taints(device: Device, evict_on_fatal: bool) -> list[dict[str, Any]]:
    """Unhealthy: what blocks (or evicts); Unknown and application Xids: what informs."""
    taints = []
    if device.health == "Unhealthy":
        taints.append(_taint(device, evict_on_fatal))
    elif device.health == "Unknown":
        taints.append(
            {"key": UNKNOWN_TAINT_KEY, "value": taint_value(device), "effect": INFO_EFFECT}
        )
    app = kind_of(device).application_xids(device)
    if app:
        value = causes_value("gpu", "gpu", [f"xid-{x}" for x in app])
        taints.append({"key": XID_TAINT_KEY, "value": value, "effect": INFO_EFFECT})
    return taints


def _gated(device: dict[str, Any], gate: Gate | None, features: ApiFeatures) -> dict[str, Any]:
    if gate is None:
        return device
    if not features.device_taints:
        attrs = {**device["attributes"], VERIFIED_ATTRIBUTE: {"bool": gate == "verified"}}
        device["attributes"] = dict(sorted(attrs.items()))
    elif gate != "verified":
        taint = {"key": UNVERIFIED_TAINT_KEY, "value": gate, "effect": TAINT_EFFECT}
        device["taints"] = [*device.get("taints", []), taint]
    return device


def _with_capacity(device: dict[str, Any], capacity: dict[str, Any]) -> dict[str, Any]:
    if capacity:
        device["capacity"] = capacity
    return device


def taint_value(device: Device) -> str:
    """What an Unhealthy device's taint says: the kind of device and why, as a label value
    (each kind says: `gpu-ecc`, `gpu-xid-79`, `gpu-ecc.xid-48.xid-79`, `rdma-link-down`;
    `gpu` / `rdma-link` alone when no cause is known). Causes that would pass the 63
    characters are left to the health reason (the Node's Events and kubelet's health stream
    carry it in full)."""
    return kind_of(device).taint_value(device)


def fatal(device: Device) -> bool:
    """Whether an Unhealthy device's fault is fatal to the work running on it."""
    # A GPU gone from the bus carries the `lost` cause (kinds/accelerator.py).
    return bool(FATAL_CAUSES.intersection(device.health_causes))


def _taint(device: Device, evict_on_fatal: bool = False) -> dict[str, Any]:
    taint: dict[str, Any] = {
        "key": TAINT_KEY,
        "value": taint_value(device),
        "effect": FATAL_EFFECT if evict_on_fatal and fatal(device) else TAINT_EFFECT,
    }
    # A failed link carries the time it was first seen, stable while it persists: the taint
    # says when trouble started. Otherwise the API server stamps the time of the first write
    # (the publisher keeps it from then on).
    since = kind_of(device).trouble_since(device)
    if since is not None:
        taint["timeAdded"] = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    return taint


# --- attributes ----------------------------------------------------------------------------


def device_attributes(device: Device, lists: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
    """A device's attributes (wire form, sorted by name) and those omitted, with why.
    `lists`: the cluster takes list values (DRAListTypeAttributes); otherwise a device on
    several NUMA nodes publishes its PCI function's node only."""
    kind = kind_of(device)
    values: list[tuple[str, Value]] = [("type", device.type), *kind.attributes(device)]

    attrs: dict[str, Any] = {}
    omitted: dict[str, str] = {}
    for name, value in values:
        if value is None:
            continue  # an unknown fact is an absent attribute, never a stand-in
        if isinstance(value, NumaNodes):
            if lists:
                attrs[name] = {"ints": list(value.nodes)}
            elif value.scalar is not None:
                attrs[name] = {"int": value.scalar}
            else:
                omitted[name] = (
                    f"on NUMA nodes {list(value.nodes)}, none of them its PCI function's: "
                    "one number would pick one; lists are off (--list-type-attributes)"
                )
            continue
        if isinstance(value, Version):
            attrs[name] = {"version": str(value)}
        elif isinstance(value, bool):
            attrs[name] = {"bool": value}
        elif isinstance(value, int):
            attrs[name] = {"int": value}
        elif len(value) > MAX_STRING_VALUE:
            omitted[name] = f"value longer than {MAX_STRING_VALUE} characters: {value!r}"
        else:
            attrs[name] = {"string": value}
    # Leave room for the capacities (memory/holders, a MIG instance's six engine counts) and
    # the health attribute.
    if len(attrs) + len(kind.counts(device)) > MAX_ATTRIBUTES_AND_CAPACITIES - 3:
        raise AssertionError(f"{device.name}: {len(attrs)} attributes exceed the API's limit")
    return dict(sorted(attrs.items())), omitted


# --- quantities ---------------------------------------------------------------------------

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def binary_quantity(n: int) -> str:
    """A byte count in the API server's canonical binary form (`81559Mi`, `80Gi`), so what
    we send compares equal to what the server returns."""
    if n < 0:
        raise ValueError(f"negative quantity {n}")
    for suffix, size in _BINARY:
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def published_device_names(slices: Iterable[dict[str, Any]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"].get("devices", [])]
