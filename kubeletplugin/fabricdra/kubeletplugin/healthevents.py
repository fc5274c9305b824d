"""One Event on the Node each time a device's health changes (docs/attributes.md, "Health and
taints").

A device's health state is (health, taint value): `Unhealthy` with `gpu-ecc` and `Unhealthy`
with `gpu-ecc.xid-79` are two states, so a new cause is an Event too. The publisher calls
`HealthEvents.sync` once per pass with the pass's devices; a device whose state is the one last
reported gets nothing, so an unchanged pass writes nothing.

After a restart this agent has reported nothing yet: the first pass takes the previous state
from the node's live ResourceSlices, which say what the cluster was last told — a device
tainted `fabricdra.io/unhealthy` (1.36 model) or with `health: Unhealthy` (1.34/1.35 model) was
Unhealthy, any other device was not. So a restart over an unchanged node emits nothing, a
device that became Unhealthy (or healed) while the agent was down gets its Event, and a healthy
node's first start is quiet (a device that comes up Healthy or Unknown is no change).

An Event that cannot be written is tried again next pass (the state is remembered only once
it was reported); Events are advice, so a failure never stops the pass's other writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from fabricdra.kube import events
from fabricdra.kube.events import ObjectRef, Reporter
from fabricdra.kube.rest import EVENTS, SLICES

from .devices import Device, DeviceInventory, Health, holder_name
from .resourceslices import TAINT_KEY, taint_value

log = structlog.get_logger("fabricdra.healthevents")

NAMESPACE = "default"  # where kubelet records a Node's events
COMPONENT = "fabricdra-kubelet-plugin"
REASONS: dict[Health, str] = {
    "Unhealthy": "DeviceUnhealthy",
    "Healthy": "DeviceHealthy",
    "Unknown": "DeviceHealthUnknown",
}


@dataclass(frozen=True, slots=True)
class State:
    health: Health | None  # None: "not Unhealthy" (all a live slice can say of such a device)
    value: str | None = None  # the taint value, Unhealthy only


def state_of(device: Device) -> State:
    if device.health == "Unhealthy":
        return State("Unhealthy", taint_value(device))
    return State(device.health)


def _changed(before: State | None, now: State) -> bool:
    if before is None:  # never published: only trouble is news
        return now.health == "Unhealthy"
    if before.health is None:  # known only as "not Unhealthy"
        return now.health == "Unhealthy"
    if before.health == "Unhealthy" and now.health == "Unhealthy" and before.value is None:
        return False  # the live slice did not say why (1.34/1.35): same trouble as far as known
    return before != now


class HealthEvents:
    def __init__(self, rest: Any, node_name: str, driver: str) -> None:
        self.rest = rest
        self.node_name = node_name
        self.driver = driver
        self._reported: dict[str, State] | None = None  # None: not seeded from the slices yet

    def sync(self, devices: DeviceInventory, node: Mapping[str, Any]) -> int:
        """Emit the Events this pass's health changes call for; returns how many."""
        if self._reported is None:
            self._reported = self._published()
        sent = 0
        for device in devices:
            now = state_of(device)
            # 1.34/1.35 publish a shared endpoint as holder devices: the first speaks for all.
            before = self._reported.get(device.name) or self._reported.get(
                holder_name(device.name, 0)
            )
            if _changed(before, now):
                self._emit(device, before, node)  # raises: the change is tried next pass
                sent += 1
            self._reported[device.name] = now
        return sent

    def _published(self) -> dict[str, State]:
        """What the live slices tell of each device's health (see the module docstring)."""
        live = self.rest.list(
            SLICES, field_selector=f"spec.nodeName={self.node_name},spec.driver={self.driver}"
        )
        out: dict[str, State] = {}
        for s in live.get("items", []):
            for d in s.get("spec", {}).get("devices", []) or []:
                taint = next(
                    (t for t in d.get("taints", []) or [] if t.get("key") == TAINT_KEY), None
                )
                health = ((d.get("attributes") or {}).get("health") or {}).get("string")
                if taint is not None:
                    out[d["name"]] = State("Unhealthy", taint.get("value"))
                elif health == "Unhealthy":
                    out[d["name"]] = State("Unhealthy")
                else:
                    out[d["name"]] = State(None)
        return out

    def _emit(self, device: Device, before: State | None, node: Mapping[str, Any]) -> None:
        was = before.health if before is not None and before.health is not None else None
        message = f"device {device.name} ({device.type}) is {device.health}"
        if was is not None:
            message += f", was {was}"
        if device.health_reason:
            message += f": {device.health_reason}"
        if device.health == "Unhealthy":
            message += f" (taint {TAINT_KEY}={taint_value(device)})"
        uid = (node.get("metadata") or {}).get("uid")
        body = events.event(
            ObjectRef("v1", "Node", self.node_name, uid=uid),
            Reporter(COMPONENT, self.node_name, COMPONENT, self.node_name),
            type="Warning" if device.health == "Unhealthy" else "Normal",
            reason=REASONS[device.health],
            message=message,
            namespace=NAMESPACE,
        )
        self.rest.create(EVENTS, body, NAMESPACE)
        log.info("device health changed", device=device.name, health=device.health, was=was)
