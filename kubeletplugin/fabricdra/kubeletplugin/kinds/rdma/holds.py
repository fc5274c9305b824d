"""How prepared claims (the checkpoint) hold this node's devices: what a pass keeps offering
a held device as, so a mode change never moves a prepared device, and which holds are worth
reading from the API (`pins_mode`)."""

from __future__ import annotations

from collections.abc import Iterable

from ...devices import DeviceInventory, HeldAs
from ...kubelet.checkpoint import ClaimEntry
from .. import rdma


def held_endpoints(entries: Iterable[ClaimEntry]) -> dict[str, HeldAs]:
    """How prepared claims hold each device (by inventory name): `shared` when allocated as a
    share (a `shareID`, or a 1.34/1.35 holder name `<endpoint>-s<k>`), else `exclusive`; an
    exclusive hold wins over a share. What the publisher keeps offering a held NIC as, so a
    mode change never moves a prepared device."""
    out: dict[str, HeldAs] = {}
    for entry in entries:
        for r in entry.devices or ():
            shared = r.share_id is not None or r.device_name != r.base_name
            if out.get(r.base_name) != "exclusive":
                out[r.base_name] = "shared" if shared else "exclusive"
    return out


def held_devices(entries: Iterable[ClaimEntry]) -> set[str]:
    """Every device prepared claims hold, by inventory name, and the devices those are part
    of (a MIG instance's GPU, a VF's PF)."""
    out: set[str] = set()
    for entry in entries:
        for r in entry.devices or ():
            out.add(r.base_name)
            if r.within is not None:
                out.add(r.within)
    return out


def pins_mode(entry: ClaimEntry, natural: DeviceInventory) -> bool:
    """Whether `entry`'s hold changes what is offered: it holds an RDMA endpoint that the
    node's modes alone (`natural`: built with no holds) offer in another mode or not at all.
    A VF is offered `vf` however it is held. GPUs are offered the same held or not."""
    for name, held_as in held_endpoints([entry]).items():
        if not name.startswith("rdma-"):  # endpoint names (`endpoint_name`); GPUs never pin
            continue
        device = natural.get(name)
        if device is None or rdma.payload_of(device).mode not in (held_as, "vf"):
            return True
    return False
