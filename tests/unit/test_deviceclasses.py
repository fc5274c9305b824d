"""The device-class table: every alias and PCI id names one class, the lookup rules, and MIG
instance classes."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fabricdra.api.deviceclasses import (
    DeviceClassTable,
    load_device_classes,
    mig_profile,
)
from fabricdra.kubeletplugin.discovery.labels import is_valid_label_value

TABLE = load_device_classes()


def test_class_names_are_unique_and_usable_as_names() -> None:
    names = [c.name for c in TABLE.classes]
    assert len(names) == len(set(names))
    for name in names:
        # Travels as an attribute value and in DeviceClass names: lowercase DNS-label shape.
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        assert is_valid_label_value(name)


def test_every_alias_names_exactly_one_class() -> None:
    normalised = Counter(" ".join(a.split()).casefold() for c in TABLE.classes for a in c.aliases)
    assert [a for a, n in normalised.items() if n > 1] == []
    for c in TABLE.classes:
        for alias in c.aliases:
            assert TABLE.by_product_name(alias) == c


def test_every_pci_id_names_exactly_one_class() -> None:
    ids = Counter(i for c in TABLE.classes for i in c.pciIds)
    assert [i for i, n in ids.items() if n > 1] == []
    for c in TABLE.classes:
        for pci_id in c.pciIds:
            assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{4}", pci_id), pci_id
            vendor, device = pci_id.split(":")
            assert TABLE.by_pci_id(f"0x{vendor}", f"0x{device}") == c


def test_fields_are_sane() -> None:
    for c in TABLE.classes:
        assert c.memoryMiB > 0
        assert c.devicesPerNode > 0
        assert c.formFactor in {"sxm", "pcie", "nvl", "oam", "server-edition"}
        assert c.architecture


@pytest.mark.parametrize(
    ("product", "cls"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb-sxm"),
        ("  nvidia   h100 80gb hbm3 ", "h100-80gb-sxm"),  # case and spacing do not matter
        ("NVIDIA H100 NVL", "h100-94gb-nvl"),
        ("NVIDIA H200", "h200-141gb-sxm"),
        ("NVIDIA H200 NVL", "h200-141gb-nvl"),
        ("AMD Instinct MI300X", "mi300x-192gb-oam"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_by_product_name(product: str, cls: str | None) -> None:
    found = TABLE.by_product_name(product)
    assert (found.name if found else None) == cls


def test_the_product_string_decides_and_the_pci_id_is_the_fallback() -> None:
    h100 = TABLE.classify(None, "0x10de", "0x2330")
    assert h100 is not None
    assert h100.name == "h100-80gb-sxm"
    # A product string nobody aliased is not overridden by the PCI id: one id can cover
    # several memory sizes.
    assert TABLE.classify("NVIDIA H100 96GB HBM3", "0x10de", "0x2330") is None
    assert TABLE.classify(None, "0x10de", None) is None
    assert TABLE.classify(None, "0x10de", "0xffff") is None


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", "1g.5gb+me"),
        ("NVIDIA H100 80GB HBM3", None),
    ],
)
def test_mig_profile(name: str, profile: str | None) -> None:
    assert mig_profile(name) == profile


def test_mig_class() -> None:
    h100 = TABLE.by_product_name("NVIDIA H100 80GB HBM3")
    assert TABLE.mig_class(h100, "NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "h100-mig-1g-10gb"
    assert TABLE.mig_class(h100, None) is None
    assert TABLE.mig_class(None, "NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None
    l4 = TABLE.by_product_name("NVIDIA L4")
    assert TABLE.mig_class(l4, "NVIDIA L4 MIG 1g.6gb") is None  # no MIG prefix: no class


def test_an_explicit_mig_alias_wins() -> None:
    table = DeviceClassTable.model_validate(
        {
            "classes": [
                {
                    "class": "h100-80gb-sxm",
                    "label": "H100",
                    "architecture": "hopper",
                    "memoryMiB": 81920,
                    "formFactor": "sxm",
                    "migPrefix": "h100",
                    "aliases": ["NVIDIA H100 80GB HBM3"],
                },
                {
                    "class": "h100-slice-small",
                    "label": "small",
                    "architecture": "hopper",
                    "memoryMiB": 10240,
                    "formFactor": "sxm",
                    "aliases": ["NVIDIA H100 80GB HBM3 MIG 1g.10gb"],
                },
            ]
        }
    )
    parent = table.by_product_name("NVIDIA H100 80GB HBM3")
    assert table.mig_class(parent, "NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "h100-slice-small"
    assert table.mig_class(parent, "NVIDIA H100 80GB HBM3 MIG 2g.20gb") == "h100-mig-2g-20gb"


def test_an_unknown_key_in_a_class_is_refused() -> None:
    with pytest.raises(ValueError, match="memoryMib"):
        DeviceClassTable.model_validate(
            {"classes": [{"class": "x", "label": "x", "architecture": "x", "memoryMib": 1}]}
        )


# The DeviceClass manifests (api/deviceclasses/): extended resource names (KEP-5004).
MANIFESTS = Path(__file__).resolve().parents[2] / "api" / "deviceclasses"
# What Kubernetes accepts as an extended resource name: a domain-prefixed name outside the
# kubernetes.io domains (k8s.io/apimachinery IsExtendedResourceName).
_EXTENDED = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def _extended_names() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        out[doc["metadata"]["name"]] = doc["spec"].get("extendedResourceName")
    return out


def test_whole_gpus_and_exclusive_rdma_endpoints_are_extended_resources() -> None:
    assert _extended_names() == {
        "efa.fabricdra.io": None,
        "gaudi.fabricdra.io": None,  # its table row names no extended resource
        "gpu.fabricdra.io": "fabricdra.io/gpu",
        "mig.fabricdra.io": None,
        "rdma-shared.fabricdra.io": None,
        "rdma-vf.fabricdra.io": None,
        "rdma.fabricdra.io": "fabricdra.io/rdma",
    }


def test_each_extended_resource_name_belongs_to_one_class_and_is_valid() -> None:
    # Two classes with one name: the scheduler silently serves the newer class only.
    names = [n for n in _extended_names().values() if n is not None]
    assert len(names) == len(set(names))
    for name in names:
        assert _EXTENDED.fullmatch(name), name
        assert "kubernetes.io/" not in name


def test_the_charts_default_names_are_the_manifests() -> None:
    values = yaml.safe_load((MANIFESTS.parents[1] / "charts/fabricdra/values.yaml").read_text())
    ext = values["extendedResources"]
    assert ext["enabled"] is True
    names = _extended_names()
    assert (ext["gpu"], ext["rdma"]) == (names["gpu.fabricdra.io"], names["rdma.fabricdra.io"])
