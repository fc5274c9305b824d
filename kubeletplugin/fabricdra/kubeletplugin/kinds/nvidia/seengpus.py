"""GPUs that fell off the bus (the kernel removed their PCI function), kept published.

A GPU a complete enumeration no longer finds is offered from its last record, Unhealthy and
marked lost (prepare refuses it), so the claims holding it keep their health signal:

- one this process saw is kept until the process ends;
- one an earlier process of this boot saw is kept while a prepared claim (the checkpoint)
  holds it or one of its MIG instances, and goes once kubelet has unprepared it. Its record
  comes from `<state dir>/gpus-seen.json`: the last record of every GPU seen in this boot,
  rewritten only when a record changed. A file of another boot (or none, or one that cannot
  be read) keeps nothing: a reboot leaves no prepared claim either.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import structlog

from fabricdra.api.inventory import Accelerator

from ...devices import gpu_name, lost_accelerators
from ...kubelet.cdi import write_atomic

log = structlog.get_logger("fabricdra.agent")


class SeenGpus:
    def __init__(self, path: Path, boot_id: str | None) -> None:
        self.path = path
        self.boot_id = boot_id
        self._seen: dict[str, Accelerator] = {}  # bus id -> last record, this process
        self._written: bytes | None = None  # what the file holds
        self._earlier = self._load()  # bus id -> last record, an earlier process of this boot

    def _load(self) -> dict[str, Accelerator]:
        try:
            self._written = self.path.read_bytes()
            doc = json.loads(self._written)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("GPU records unreadable; none kept", path=str(self.path), error=str(e))
            return {}
        if not isinstance(doc, dict) or not self.boot_id or doc.get("bootId") != self.boot_id:
            return {}  # of another boot (or unknown): no claim of then is prepared now
        out: dict[str, Accelerator] = {}
        for raw in doc.get("gpus") or []:
            try:
                acc = Accelerator.model_validate(raw)
            except ValueError as e:
                log.warning("GPU record unreadable; not kept", error=str(e))
                continue
            out[acc.pciBusId] = acc
        return out

    def update(
        self, current: Sequence[Accelerator] | None, held: Collection[str]
    ) -> list[Accelerator]:
        """Record this pass's GPUs (`current`; None: the enumeration failed, nothing is
        lost) and return the lost ones to keep offering. `held`: device names prepared
        claims hold (a GPU's name, or the GPU a MIG instance is part of)."""
        if current is None:
            return []
        lost = lost_accelerators(current, self._seen)
        for acc in current:
            self._seen[acc.pciBusId] = acc
        present = {acc.pciBusId for acc in current}
        # An earlier process's GPU: kept while held, forgotten for good once not (or back).
        self._earlier = {
            bus: acc
            for bus, acc in self._earlier.items()
            if bus not in present and bus not in self._seen and gpu_name(acc) in held
        }
        lost.extend(self._earlier[bus] for bus in sorted(self._earlier))
        self._save()
        return lost

    def _save(self) -> None:
        records = {**self._earlier, **self._seen}
        doc: dict[str, Any] = {
            "bootId": self.boot_id,
            "gpus": [
                records[b].model_dump(mode="json", exclude_none=True) for b in sorted(records)
            ],
        }
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        if data == self._written:
            return
        try:
            write_atomic(self.path, data, 0o600, durable=False)
        except OSError as e:  # the GPUs are still kept by this process; retried next pass
            log.warning("GPU records not written", path=str(self.path), error=str(e))
            return
        self._written = data
