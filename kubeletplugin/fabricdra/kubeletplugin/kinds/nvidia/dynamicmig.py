"""Creating and destroying MIG instances for dynamic MIG, so that none is ever leaked or
wrongly destroyed: the lifecycle prepare/unprepare use (prepare.py), over NVML's calls
(`MigNvml`; on a node `mignvml.LiveMigNvml`); the agent runs `recover` before it serves kubelet.

The order, and why:

1. **Record the intent** (claim, device, GPU, profile, placement) in the journal, durably,
   *before* asking NVML. A crash after NVML created the instance but before we learnt its ids
   then still leaves a record naming the placement, so `recover` finds it and destroys it;
   recording after creation would leave an instance no file names — leaked until someone
   runs nvidia-smi.
2. **Create** the GPU instance at exactly that placement, and its compute instance.
3. **Record the ids** (GPU/compute instance, UUID) against the intent. Only then is the
   instance used (device nodes, CDI spec).

Unprepare destroys only what the journal says we created, and only while NVML still lists
that very instance (same id, placement and UUID: ids are reused, UUIDs are not), and drops the
record after NVML destroyed it (a crash between the two leaves a record whose instance is gone:
`recover` drops it). Instances that existed when the agent started (static MIG) are
adopted: they are never in the journal, so nothing here ever destroys one. `recover` runs at
start-up, before anything is prepared: an intent without ids is an instance whose creation may
have happened; the instance NVML shows at that placement with that profile is ours (the
placement was free when offered: the publisher offers no placement an existing instance
overlaps), so it is destroyed, and the record dropped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import structlog

from ...kubelet.cdi import write_atomic

log = structlog.get_logger("fabricdra.dynamicmig")


@dataclass(frozen=True)
class Instance:
    """One GPU instance (with its compute instance) as NVML reports it."""

    gpu_instance: int
    compute_instance: int
    uuid: str
    profile: str
    start: int


class MigNvml(Protocol):
    """The NVML calls dynamic MIG makes, per GPU (PCI bus id)."""

    def create(self, bus: str, profile: str, start: int) -> Instance:
        """nvmlDeviceCreateGpuInstanceWithPlacement, then its compute instance."""
        ...

    def destroy(self, bus: str, gpu_instance: int) -> None:
        """Its compute instances, then nvmlGpuInstanceDestroy."""
        ...

    def instances(self, bus: str) -> list[Instance]: ...


class DynamicMigError(Exception):
    pass


class JournalUnreadable(DynamicMigError):
    pass


class MigLeftBehind(DynamicMigError):
    """Creation failed and what NVML had made of it could not be destroyed: the intent stays
    in the journal, so `recover` destroys it at the next start."""


@dataclass
class Record:
    claim: str  # the claim's UID
    device: str  # the placement device's name
    bus: str
    profile: str
    start: int
    created: Instance | None = None  # None: intent only (creation may or may not have run)


class DynamicMig:
    def __init__(self, nvml: MigNvml, journal: Path) -> None:
        self.nvml = nvml
        self.path = journal
        self._lock = threading.Lock()

    # -- the journal -------------------------------------------------------------------

    def records(self) -> list[Record]:
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except ValueError as e:
            # Never treated as empty: that would forget instances we created.
            raise JournalUnreadable(f"MIG journal {self.path} cannot be read: {e}") from None
        out = []
        for r in raw.get("records", []):
            created = r.pop("created", None)
            out.append(Record(**r, created=Instance(**created) if created else None))
        return out

    def _save(self, records: list[Record]) -> None:
        data = {"records": [asdict(r) for r in records]}
        write_atomic(self.path, json.dumps(data, sort_keys=True).encode(), durable=True)

    # -- lifecycle ---------------------------------------------------------------------

    def create(self, claim: str, device: str, bus: str, profile: str, start: int) -> Instance:
        """The instance for `device` of `claim`: created now, or the one created before
        (a repeated prepare)."""
        with self._lock:
            records = self.records()
            for r in records:
                if r.device == device and r.bus == bus:
                    if r.claim != claim:
                        raise DynamicMigError(f"{device} is held by claim {r.claim}")
                    if r.created is not None:
                        return r.created
            intent = Record(claim, device, bus, profile, start)
            records = [r for r in records if not (r.device == device and r.bus == bus)]
            self._save([*records, intent])  # 1. the intent, before NVML is asked
            try:
                made = self.nvml.create(bus, profile, start)  # 2.
            except MigLeftBehind:
                raise  # the intent stays: recover destroys what is left
            except Exception:
                self._save(records)  # nothing was created: forget the intent
                raise
            intent.created = made
            self._save([*records, intent])  # 3. the ids, before the instance is used
            log.info("MIG instance created", device=device, claim=claim, uuid=made.uuid)
            return made

    def created(self) -> set[str]:
        """The MIG device UUIDs of the instances the journal says we created (published
        under their placement's name: `build_devices(created_mig=...)`)."""
        return {r.created.uuid for r in self.records() if r.created is not None}

    def destroy(self, claim: str, devices: Collection[str] | None = None) -> list[str]:
        """Destroy every instance the journal says `claim` had created (only those of
        `devices`, where given); the names of their devices. Instances not in the journal
        (adopted ones) are never touched, nor one that is no longer the instance we created
        (its GPU instance id now names another: destroyed behind our back, or a reboot)."""
        with self._lock:
            records = self.records()
            done = []
            for r in [r for r in records if r.claim == claim]:
                if devices is not None and r.device not in devices:
                    continue
                if r.created is not None and self._still_ours(r.bus, r.created):
                    self.nvml.destroy(r.bus, r.created.gpu_instance)
                records.remove(r)
                self._save(records)  # after NVML: a crash between leaves a stale record
                done.append(r.device)
            return done

    def recover(self) -> list[str]:
        """At start-up: destroy instances created before a crash that never got their ids
        recorded, and drop records whose instance is gone. The devices concerned."""
        with self._lock:
            records = self.records()
            keep, touched = [], []
            for r in records:
                present = self.nvml.instances(r.bus)
                if r.created is None:
                    for inst in present:
                        if (inst.profile, inst.start) == (r.profile, r.start):
                            self.nvml.destroy(r.bus, inst.gpu_instance)
                            log.warning("destroyed a MIG instance left by a crash", device=r.device)
                    touched.append(r.device)
                elif not any(_same(i, r.created) for i in present):
                    # destroyed already (crash after NVML), or its id names another instance
                    touched.append(r.device)
                else:
                    keep.append(r)
            if touched:
                self._save(keep)
            return touched

    def _still_ours(self, bus: str, made: Instance) -> bool:
        return any(_same(i, made) for i in self.nvml.instances(bus))


def _same(present: Instance, made: Instance) -> bool:
    """The instance NVML lists is the one we created: the same GPU instance id, placement
    and MIG device UUID (ids are reused once an instance is destroyed)."""
    return (present.gpu_instance, present.profile, present.start, present.uuid) == (
        made.gpu_instance,
        made.profile,
        made.start,
        made.uuid,
    )
