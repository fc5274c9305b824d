"""The plugin's checkpoint: what each prepared claim created, so unprepare removes exactly that,
also after a restart (kubelet may unprepare in a later plugin process, or a new pod).

Public surface: `Checkpoint(path)` with `get(uid)`, `put(entry)`, `remove(uid)`, `entries()`;
`ClaimEntry` (namespace, name, uid, the CDI spec files written).
Every change rewrites the whole file atomically (temp + fsync + rename): a crash leaves the old
or the new checkpoint, never a torn one. A checkpoint that cannot be parsed is a clear error at
start-up (`CheckpointError`), never silently treated as empty, since that would strand the
specs it names.

Only what a claim *created* is recorded; responses are recomputed from the current inventory
(seed 000: "nothing an allocation does is written down" beyond what is needed to undo it).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cdi import write_atomic

VERSION = 1


class CheckpointError(Exception):
    """The checkpoint file exists but is not one this version can read."""


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    cdi_specs: tuple[str, ...]  # absolute paths of the spec files this claim wrote

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "cdiSpecs": list(self.cdi_specs),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimEntry:
        return cls(
            uid=str(d["uid"]),
            namespace=str(d["namespace"]),
            name=str(d["name"]),
            cdi_specs=tuple(str(p) for p in d.get("cdiSpecs", ())),
        )


class Checkpoint:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._claims: dict[str, ClaimEntry] = self._load()

    def _load(self) -> dict[str, ClaimEntry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            if doc.get("version") != VERSION:
                raise CheckpointError(
                    f"checkpoint {self.path}: version {doc.get('version')!r}, expected {VERSION}"
                )
            entries = [ClaimEntry.from_dict(c) for c in doc["claims"]]
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"checkpoint {self.path} cannot be read: {e}") from e
        return {e.uid: e for e in entries}

    def get(self, uid: str) -> ClaimEntry | None:
        with self._lock:
            return self._claims.get(uid)

    def entries(self) -> list[ClaimEntry]:
        with self._lock:
            return sorted(self._claims.values(), key=lambda e: e.uid)

    def put(self, entry: ClaimEntry) -> None:
        with self._lock:
            if self._claims.get(entry.uid) == entry:
                return
            claims = {**self._claims, entry.uid: entry}
            self._save(claims)
            self._claims = claims

    def remove(self, uid: str) -> bool:
        with self._lock:
            if uid not in self._claims:
                return False
            claims = {k: v for k, v in self._claims.items() if k != uid}
            self._save(claims)
            self._claims = claims
            return True

    def _save(self, claims: dict[str, ClaimEntry]) -> None:
        doc = {
            "version": VERSION,
            "claims": [claims[k].to_dict() for k in sorted(claims)],
        }
        # Compact: the whole file is rewritten on every change, and json's C encoder only
        # runs without indent (with it, 200 claims cost tens of ms per prepare).
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        write_atomic(self.path, data, 0o600)
