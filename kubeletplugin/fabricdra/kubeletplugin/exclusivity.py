"""Which claims may hold a device at the same time: prepare's in-use check, in one place.

The checkpoint records every device each prepared claim holds. A new claim's devices are
compared with those holds (and with each other), and prepare refuses the claim when two would
overlap in a way the node did not offer:

* What a grant holds (`Hold.kind`): `admin` for an admin-access request (it holds nothing, so
  it never conflicts); `shared` for an allocation the scheduler made of a device published
  shared — a result with a `shareID` (1.36 model) or a holder name `<endpoint>-s<k>` (1.34/1.35
  model); `exclusive` for everything else. A `shareID` on a device this node does not publish
  shared now (a GPU, or an endpoint after `--rdma-mode` was switched to exclusive) is refused:
  the 1.34/1.35 holder names of such an endpoint no longer resolve either, so both models
  agree, and a share never lands beside an exclusive holder.
* Where two holds meet (`overlaps`): the same device, or one is part of the other — a MIG
  instance is part of its GPU, a virtual function part of its physical function (`Hold.within`,
  recorded in the checkpoint). MIG instances of one GPU, or VFs of one PF, do not meet.
* Two holds that meet may coexist only when both are `shared`, or either is `admin`. So a
  shared grant never lands on an endpoint held exclusively before an `--rdma-mode` switch, an
  exclusive grant never on one held shared, a whole GPU and its MIG instances exclude each other
  both ways (MIG mode toggled between two prepares), and so do a PF and its VFs (VFs created or
  removed between two prepares; a VF is always exclusive).

Checkpoint entries of a version 1 file name no devices: they hold nothing we can see. Records
written before `within` was recorded get it from the name where the name says it (a MIG
instance with GPU/compute instance ids); a VF recorded then is compared by its own name only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .devices import Device
from .kinds import kind_of
from .kinds.nvidia import gpusharing
from .kubelet import PrepareError
from .kubelet.checkpoint import ClaimEntry, PreparedRecord

HoldKind = Literal["exclusive", "shared", "admin"]


@dataclass(frozen=True, slots=True)
class Hold:
    """One device a claim holds or asks for."""

    device: str  # the inventory device (a shared holder name stands for its endpoint)
    within: str | None  # the device it is part of: a MIG instance's GPU, a VF's PF
    kind: HoldKind


def within(device: Device) -> str | None:
    """The device `device` is part of, by the name that device has (or had) when offered:
    its kind says (kinds/)."""
    return kind_of(device).within(device)


def grant_hold(
    device: Device, allocated_name: str, share_id: str | None, admin_access: bool
) -> Hold:
    """What an allocation result asks to hold; refuses a shared allocation of a device this
    node does not publish shared."""
    shared_allocation = share_id is not None or allocated_name != device.name
    if shared_allocation and not kind_of(device).shareable(device):
        how = f"shareID {share_id}" if share_id is not None else "a holder name"
        raise PrepareError(
            f"device {allocated_name} was allocated as a share ({how}), but this "
            "node does not offer it shared (its RDMA mode or GPU sharing changed since, or it "
            "is never shared): refusing to hand it out beside an exclusive holder; delete and "
            "recreate the claim"
        )
    kind: HoldKind = "admin" if admin_access else "shared" if shared_allocation else "exclusive"
    return Hold(device.name, within(device), kind)


_MIG_WITH_IDS = re.compile(r"^mig-(.+)-gi[0-9]+-ci[0-9]+$")


def recorded_hold(record: PreparedRecord) -> Hold:
    """What a checkpointed device holds. A record is shared when it was allocated as a share
    (`grant_hold` never prepares a share of a device not offered shared)."""
    kind: HoldKind
    if record.admin_access:
        kind = "admin"
    elif record.share_id is not None or record.device_name != record.base_name:
        kind = "shared"
    else:
        kind = "exclusive"
    part_of = record.within
    if part_of is None:  # written before `within` was recorded
        m = _MIG_WITH_IDS.match(record.base_name)
        part_of = f"gpu-{m.group(1)}" if m else None
    return Hold(record.base_name, part_of, kind)


def overlaps(a: Hold, b: Hold) -> bool:
    """The same hardware: one device, or one part of the other."""
    return a.device == b.device or a.within == b.device or b.within == a.device


def may_coexist(a: Hold, b: Hold) -> bool:
    if not overlaps(a, b):
        return True
    return "admin" in (a.kind, b.kind) or a.kind == b.kind == "shared"


@dataclass(frozen=True, slots=True)
class Conflict:
    index: int  # which of the wanted holds
    holder: ClaimEntry | None  # the claim holding the other; None: the same claim
    held: Hold

    def reason(self, wanted: Hold, label: str) -> str:
        """Why the device `label` (as allocated, with its request) cannot be prepared."""
        who = (
            "this claim's own allocation"
            if self.holder is None
            else f"claim {self.holder.namespace}/{self.holder.name} (uid {self.holder.uid})"
        )
        held = self.held
        if held.device == wanted.device:
            what = f"device {label} is already prepared for {who}"
        elif held.within == wanted.device:
            what = f"device {label} contains {held.device}, which is already prepared for {who}"
        else:
            what = f"device {label} is part of {held.device}, which is already prepared for {who}"
        if held.kind == "exclusive" and wanted.kind == "exclusive":
            how = "and is not shared"
        elif held.kind == "exclusive":
            how = "exclusively; a share cannot be added"
        else:
            how = "as a share; this claim was allocated it exclusively"
        return f"{what} {how}: refusing to hand it to a second claim"


def find_conflict(
    uid: str, wanted: Sequence[Hold], entries: Iterable[ClaimEntry]
) -> Conflict | None:
    """The first of `wanted` (claim `uid`'s holds, in allocation order) that cannot coexist
    with a device another prepared claim holds, or with an earlier device of the same claim."""
    held: list[tuple[ClaimEntry, Hold]] = [
        (entry, recorded_hold(r))
        for entry in entries
        if entry.uid != uid  # a repeated prepare replaces its own entry
        for r in entry.devices or ()
    ]
    for i, w in enumerate(wanted):
        for entry, h in held:
            if not may_coexist(w, h):
                return Conflict(i, entry, h)
        for earlier in wanted[:i]:
            if not may_coexist(w, earlier):
                return Conflict(i, None, earlier)
    return None


def find_over_capacity(
    uid: str,
    wanted: Sequence[tuple[Device, Hold, dict[str, int] | None]],
    entries: Iterable[ClaimEntry],
) -> tuple[int, str] | None:
    """The first share of a shared GPU among `wanted` (claim `uid`'s devices with their holds
    and consumed capacities, in allocation order) whose consumed capacity does not fit beside
    the shares other prepared claims (and this claim's earlier devices) hold on the same GPU,
    and why; None: all fit. A recorded share without a record of what it consumes counts as
    the whole GPU (gpusharing.over_capacity)."""
    held: dict[str, list[dict[str, int]]] = {}
    for entry in entries:
        if entry.uid == uid:
            continue
        for r in entry.devices or ():
            if recorded_hold(r).kind == "shared":
                held.setdefault(r.base_name, []).append(dict(r.consumed or ()))
    for i, (device, hold, use) in enumerate(wanted):
        if use is None or hold.kind != "shared":
            continue
        why = gpusharing.over_capacity(device, use, held.get(device.name, []))
        if why is not None:
            return i, why
        held.setdefault(device.name, []).append(use)
    return None
