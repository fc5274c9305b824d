"""The `fabricdra inventory` document: one discovery pass as JSON, and reading an earlier one
back (`--previous`) for the first-seen merge and the failed-enumeration rule."""

from __future__ import annotations

import json
import os
from typing import Any

from fabricdra.api.inventory import Accelerator, Interface
from fabricdra.api.records import dump, first_error

from .discovery.node import Discovery, Previous


class PreviousError(Exception):
    """An unusable --previous file; the message names the file and what is wrong."""


def inventory_document(d: Discovery, sysfs_root: str) -> dict[str, Any]:
    nvml: dict[str, Any] | None = None
    if d.nvml is not None:
        nvml = {
            "source": d.nvml.source,
            "available": d.nvml.available,
            "reason": d.nvml.reason,
            "errors": d.nvml.errors,
        }
    return {
        "sysfsRoot": sysfs_root,
        "enumeration": {
            "interfaces": d.failures.get("interfaces", "ok"),
            "accelerators": d.failures.get("accelerators", "ok"),
        },
        "nvml": nvml,
        "interfaces": None if d.interfaces is None else dump(d.interfaces, mode="json"),
        "accelerators": None if d.accelerators is None else dump(d.accelerators, mode="json"),
        "labels": dict(sorted(d.labels.desired.items())),
        "labelsUnknown": sorted(d.labels.unknown),
        "labelsRejected": dict(sorted(d.labels.rejected.items())),
    }


def load_previous(path: str | os.PathLike[str]) -> Previous:
    p = os.fspath(path)  # os, not pathlib: importing pathlib was ~3 % of inventory start-up
    try:
        with open(p) as f:
            doc = json.load(f)
    except OSError as e:
        raise PreviousError(f"previous inventory {p}: cannot read: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PreviousError(f"previous inventory {p}: not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise PreviousError(f"previous inventory {p}: expected a JSON object")
    # Input: pydantic validates it (imported here, so a run without --previous never pays).
    from pydantic import TypeAdapter

    try:
        interfaces = doc.get("interfaces")
        accelerators = doc.get("accelerators")
        return Previous(
            interfaces=None
            if interfaces is None
            else TypeAdapter(list[Interface]).validate_python(interfaces),
            accelerators=None
            if accelerators is None
            else TypeAdapter(list[Accelerator]).validate_python(accelerators),
        )
    except ValueError as e:  # pydantic's ValidationError is one
        where, msg = first_error(e)
        raise PreviousError(f"previous inventory {p}: {where}: {msg}") from e
