"""Canonical accelerator device classes (`h100-80gb-sxm`, …) and the alias table behind them.

Vendor product strings vary by driver and tool ("NVIDIA H100 80GB HBM3"); scheduling wants one
stable name per kind of accelerator. The table is data (deviceclasses.json) so adding hardware
is a one-row change that every component picks up together.
"""

from __future__ import annotations

import json
import pkgutil
import re
from functools import cache
from typing import Any, ClassVar

# Records, not pydantic models: discovery classifies every accelerator, and importing pydantic
# for that was most of `fabricdra inventory`'s start-up (api/records.py).
from .records import Field, Record


class DeviceClass(Record):
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid", "populate_by_name": True}

    name: str = Field(wire_name="class")
    label: str
    architecture: str
    memoryMiB: int
    formFactor: str
    devicesPerNode: int = 8
    migPrefix: str | None = None
    aliases: list[str] = Field(default_factory=list)
    pciIds: list[str] = Field(default_factory=list)


class DeviceClassTable(Record):
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "ignore"}

    classes: list[DeviceClass]

    def by_product_name(self, product: str) -> DeviceClass | None:
        wanted = _normalise(product)
        for c in self.classes:
            if any(_normalise(a) == wanted for a in c.aliases):
                return c
        return None

    def by_pci_id(self, vendor_id: str, device_id: str) -> DeviceClass | None:
        key = f"{_hex4(vendor_id)}:{_hex4(device_id)}"
        for c in self.classes:
            if key in c.pciIds:
                return c
        return None

    def classify(
        self, product: str | None, vendor_id: str, device_id: str | None
    ) -> DeviceClass | None:
        """The product string decides when there is one; the PCI id is the fallback for hosts
        where no vendor library answered. One PCI id can cover several memory sizes, so it never
        overrides a product string."""
        if product:
            return self.by_product_name(product)
        if device_id:
            return self.by_pci_id(vendor_id, device_id)
        return None

    def mig_class(self, parent: DeviceClass | None, mig_name: str | None) -> str | None:
        """A MIG instance's class: an explicit alias first, else <migPrefix>-mig-<profile>."""
        if mig_name is None:
            return None
        explicit = self.by_product_name(mig_name)
        if explicit is not None:
            return explicit.name
        profile = mig_profile(mig_name)
        if parent is None or parent.migPrefix is None or profile is None:
            return None
        return f"{parent.migPrefix}-mig-{profile.replace('.', '-')}"


_MIG_PROFILE = re.compile(r"\bMIG\s+(\d+g\.\d+gb(?:\+[a-z]+)?)\b", re.IGNORECASE)


def mig_profile(mig_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3 MIG 1g.10gb' -> '1g.10gb' (NVML's MIG device naming)."""
    m = _MIG_PROFILE.search(mig_name)
    return m.group(1).lower() if m else None


def _normalise(s: str) -> str:
    return " ".join(s.split()).casefold()


def _hex4(v: str) -> str:
    return format(int(v, 16), "04x")


@cache
def load_device_classes() -> DeviceClassTable:
    # The package loader's own read (pkgutil.get_data: a folder or a zip alike), not
    # importlib.resources, which imports zipfile and tempfile: ~5 ms of every `fabricdra
    # inventory` (bench/startup.py).
    data = pkgutil.get_data(__package__ or "fabricdra.api", "deviceclasses.json")
    if data is None:
        raise FileNotFoundError("fabricdra.api: deviceclasses.json is not in the package")
    return DeviceClassTable.model_validate(json.loads(data))
