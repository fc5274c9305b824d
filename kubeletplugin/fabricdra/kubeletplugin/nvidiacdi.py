"""The NVIDIA container toolkit's CDI spec, where the host has one (`nvidia-ctk cdi generate`,
kind `nvidia.com/gpu`): the ids prepare returns for granted GPUs and MIG instances, so the
runtime mounts the driver libraries the supported way.

A toolkit device is matched to a GPU by UUID (its name, with the `uuid` naming strategy) or
else by the device nodes it injects, which holds whatever naming strategy generated it: a
whole GPU's device holds exactly its `/dev/nvidiaN` and no capability node; a MIG instance's
device holds exactly its parent's `/dev/nvidiaN` and exactly the instance's
`/dev/nvidia-caps/nvidia-capN` pair. A device with any other GPU or capability node (the
toolkit's `all`, which sorts first under the `type-index` strategy) is never a match: it would
hand the container GPUs or instances nobody was granted.
Files are re-read only when their modification time or size changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

log = structlog.get_logger("fabricdra.nvidiacdi")

TOOLKIT_KIND = "nvidia.com/gpu"
DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


_GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")
_CAP_NODE = re.compile(r"/dev/nvidia-caps/nvidia-cap[0-9]+")


@dataclass(frozen=True, slots=True)
class ToolkitDevice:
    name: str
    node_paths: frozenset[str]  # container paths of its device nodes

    @property
    def gpu_nodes(self) -> frozenset[str]:
        return frozenset(p for p in self.node_paths if _GPU_NODE.fullmatch(p))

    @property
    def cap_nodes(self) -> frozenset[str]:
        return frozenset(p for p in self.node_paths if _CAP_NODE.fullmatch(p))

    @property
    def cdi_id(self) -> str:
        return f"{TOOLKIT_KIND}={self.name}"


class ToolkitSpecs:
    def __init__(self, spec_dirs: Sequence[Path] = DEFAULT_SPEC_DIRS) -> None:
        self.spec_dirs = tuple(spec_dirs)
        self._key: tuple[tuple[str, int, int], ...] | None = None
        self._devices: dict[str, ToolkitDevice] = {}

    def devices(self) -> dict[str, ToolkitDevice]:
        files = sorted(self._files())
        key = tuple((str(p), st.st_mtime_ns, st.st_size) for p, st in files)
        if key != self._key:
            self._devices = {}
            for path, _ in files:  # later folders win, as in the CDI library
                self._devices.update(_load(path))
            self._key = key
        return self._devices

    def _files(self) -> Iterable[tuple[Path, os.stat_result]]:
        for d in self.spec_dirs:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                # Our own per-claim specs share the folder: skipping them keeps the cache
                # valid across prepares (each writes one) and the toolkit lookup cheap.
                if "fabricdra.io" in e.name:
                    continue
                if e.name.endswith((".json", ".yaml")) and e.is_file():
                    yield Path(e.path), e.stat()

    def gpu_id(self, uuid: str | None, minor: int | None) -> str | None:
        devices = self.devices()
        if uuid and uuid in devices:
            return devices[uuid].cdi_id
        if minor is None:
            return None
        node = f"/dev/nvidia{minor}"
        for d in sorted(devices.values(), key=lambda d: d.name):
            if d.gpu_nodes == {node} and not d.cap_nodes:
                return d.cdi_id
        return None

    def mig_id(
        self, uuid: str | None, minor: int | None = None, cap_paths: Sequence[str] = ()
    ) -> str | None:
        """The toolkit id of one MIG instance: by UUID, else the device holding exactly the
        parent GPU's node `/dev/nvidia<minor>` and exactly the instance's capability pair."""
        devices = self.devices()
        if uuid and uuid in devices:
            return devices[uuid].cdi_id
        if minor is None or not cap_paths:
            return None
        node, caps = f"/dev/nvidia{minor}", frozenset(cap_paths)
        for d in sorted(devices.values(), key=lambda d: d.name):
            if d.gpu_nodes == {node} and d.cap_nodes == caps:
                return d.cdi_id
        return None


def _load(path: Path) -> dict[str, ToolkitDevice]:
    try:
        text = path.read_text()
        doc: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        log.warning("cannot read CDI spec", path=str(path), error=str(e))
        return {}
    if not isinstance(doc, dict) or doc.get("kind") != TOOLKIT_KIND:
        return {}
    out: dict[str, ToolkitDevice] = {}
    for dev in doc.get("devices") or []:
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            continue
        nodes = (dev.get("containerEdits") or {}).get("deviceNodes") or []
        paths = frozenset(n["path"] for n in nodes if isinstance(n, dict) and "path" in n)
        out[dev["name"]] = ToolkitDevice(dev["name"], paths)
    return out
