"""The scale-out tier labels (issue 27 points 3-5): the I/O shell around scaleout.py.

One key (`TREE`): the tree is the whole cluster's (a node's block is known only from its
peers' cabling), so every reconcile computes every node's verdict from the caches, the
topology file and the ibnetdiscover ConfigMaps, and writes a Node only where its tier labels or
its cabling annotation differ from the verdict: nothing is rewritten when nothing changed.

Never decided from what could not be read: an unsynced cache, an unreadable topology file or
dump raises (the key is retried) and no label is written or removed meanwhile. A node with no
NodeDevices record yet (its agent has not reported) is left as it is, unless the topology file
places it. Removal rules: docs/labels.md, "Scale-out tiers".
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricdra.api import labels
from fabricdra.api.jsontypes import JSON
from fabricdra.api.scaleout import TIER_LABELS, DeclaredTopology, parse_topology_file

from .deps import Cache, EnqueueAfter
from .scaleout import FabricDump, Verdict, build_tree, nics_of, parse_ibnetdiscover
from .status import Event

log = logging.getLogger("fabricdra.controller")

TREE = "scale-out-tree"
# The ConfigMaps an ibnetdiscover Job writes (one per fabric, in the driver's namespace): the
# label's value names the fabric; the dump is under DUMP_KEY (text) or DUMP_KEY_GZ (binaryData,
# gzipped: what `fabricdra fabric-dump` writes, a large fabric's text outgrowing 1 MiB).
DUMP_LABEL = labels.PREFIX + "ibnetdiscover"
DUMP_KEY = "ibnetdiscover.txt"
DUMP_KEY_GZ = DUMP_KEY + ".gz"
# Re-read the topology file this often (a mounted ConfigMap changes under the process).
FILE_POLL_SECONDS = 60.0


class InputUnreadable(Exception):
    """The topology file or a dump could not be read: nothing is decided until it can."""


def node_view(obj: Mapping[str, Any]) -> JSON:
    """A Node cut down to what the tier labels read (an informer transform over every Node):
    its name, its fabricdra.io/ labels and the cabling annotation. No resourceVersion: a status
    heartbeat then leaves the cached Node equal, and computes no tree (manager.py)."""
    meta = obj.get("metadata") or {}
    kept = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(labels.PREFIX)}
    ann = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "labels": kept,
            "annotations": {k: ann[k] for k in (labels.CABLING_CHECK,) if k in ann},
        }
    }


def cabling_record(v: Verdict) -> str | None:
    """The node's cabling annotation: JSON, stable (no timestamps: an unchanged verdict is an
    unchanged value, never rewritten). None where there was nothing to check: no block and no
    finding (a disagreement is a finding even on a NIC that makes no block)."""
    if not v.block and not v.failures:
        return None
    record: dict[str, Any] = {
        "result": "Passed" if v.passed else "Failed",
        "railOptimised": v.checked,
        "leaves": len(v.block),
    }
    if v.failures:
        record["findings"] = list(v.failures)
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def desired(v: Verdict) -> tuple[dict[str, str | None], str | None]:
    """The tier labels (None: absent) and the annotation a verdict gives."""
    want: dict[str, str | None] = dict.fromkeys(TIER_LABELS)
    for key, value in zip(TIER_LABELS, v.tiers, strict=False):
        want[key] = value
    return want, cabling_record(v)


@dataclass(frozen=True)
class TierDeps:
    nodes: Cache  # every Node (node_view)
    node_devices: Cache  # NodeDevices (fabriccheck.node_devices_view: interfaces kept)
    dumps: Cache  # the ibnetdiscover ConfigMaps (DUMP_LABEL)
    topology_file: str  # "" for none
    patch_node: Callable[[str, JSON], object]
    node_event: Callable[[str, Event], None]
    require_synced: Callable[[], None]
    requeue_after: EnqueueAfter
    clock: Callable[[], float] = time.monotonic


class TierLabels:
    def __init__(self, deps: TierDeps) -> None:
        self.d = deps
        self._next_poll = 0.0  # one file poll pending at a time, however many events come

    def declared(self) -> DeclaredTopology | None:
        path = self.d.topology_file
        if not path:
            return None
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise InputUnreadable(f"topology file {path}: {e}") from e
        try:
            return parse_topology_file(text)
        except ValueError as e:
            raise InputUnreadable(f"topology file {path}: {e}") from e

    def fabric_dumps(self) -> list[FabricDump]:
        out = []
        for cm in sorted(self.d.dumps.items(), key=lambda o: o["metadata"]["name"]):
            name = cm["metadata"]["name"]
            text = (cm.get("data") or {}).get(DUMP_KEY)
            packed = (cm.get("binaryData") or {}).get(DUMP_KEY_GZ)
            if text is None and packed is not None:
                try:
                    text = gzip.decompress(base64.b64decode(packed)).decode()
                except (binascii.Error, OSError, EOFError, UnicodeDecodeError) as e:
                    raise InputUnreadable(f"ConfigMap {name}: {DUMP_KEY_GZ}: {e}") from e
            if text is None:
                raise InputUnreadable(f"ConfigMap {name} has neither {DUMP_KEY} nor {DUMP_KEY_GZ}")
            try:
                out.append(parse_ibnetdiscover(text, source=f"ConfigMap {name}"))
            except ValueError as e:
                raise InputUnreadable(str(e)) from e
        return out

    def reconcile(self, key: str) -> None:
        d = self.d
        d.require_synced()
        if d.topology_file and d.clock() >= self._next_poll:
            self._next_poll = d.clock() + FILE_POLL_SECONDS
            d.requeue_after(TREE, FILE_POLL_SECONDS)
        declared = self.declared()
        dumps = self.fabric_dumps()
        placed = declared.nodes() if declared is not None else set()
        facts = {}
        for node in d.nodes.items():
            name = node["metadata"]["name"]
            record = d.node_devices.get(name)
            if record is None and name not in placed:
                continue  # its agent has not reported: nothing known, nothing changed
            facts[name] = nics_of(record)
        verdicts = build_tree(facts, dumps, declared)
        for name, verdict in sorted(verdicts.items()):
            current = d.nodes.get(name)
            if current is not None:
                self._write(current, verdict)

    def _write(self, node: JSON, v: Verdict) -> None:
        meta = node["metadata"]
        name = meta["name"]
        have_labels = meta.get("labels") or {}
        have_record = (meta.get("annotations") or {}).get(labels.CABLING_CHECK)
        want_labels, want_record = desired(v)
        label_patch = {k: w for k, w in want_labels.items() if have_labels.get(k) != w}
        if not label_patch and have_record == want_record:
            return
        patch: JSON = {"metadata": {"labels": label_patch}}
        if have_record != want_record:
            patch["metadata"]["annotations"] = {labels.CABLING_CHECK: want_record}
        self.d.patch_node(name, patch)
        was_failed = _failed(have_record)
        if not v.passed and (not was_failed or have_record != want_record):
            log.warning("scale-out cabling check failed on %s: %s", name, "; ".join(v.failures))
            self.d.node_event(
                name,
                Event(
                    "Warning",
                    "ScaleOutCablingFailed",
                    "scale-out cabling check failed; tier labels removed until fixed: "
                    + "; ".join(v.failures),
                ),
            )
        elif v.passed and was_failed:
            self.d.node_event(
                name, Event("Normal", "ScaleOutCablingPassed", "scale-out cabling check passed")
            )


def _failed(record: str | None) -> bool:
    if not record:
        return False
    try:
        return bool(json.loads(record).get("result") == "Failed")
    except (ValueError, AttributeError):
        return False
