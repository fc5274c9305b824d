"""The sample node bundled with the package is exactly what tests/sysfs/sample_node.py
generates, and it shows what the README promises."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from fabricdra.api import labels as keys
from fabricdra.kubeletplugin import samples
from fabricdra.kubeletplugin.samples import sample_node
from tests.sysfs import sample_node as generator
from tests.sysfs.nodes import discover_at


def test_the_bundled_archive_equals_a_fresh_generation(tmp_path: Path) -> None:
    generator.build(tmp_path)
    fresh = generator.archive_bytes(tmp_path)
    bundled = resources.files(samples.__name__).joinpath(samples.ARCHIVE).read_bytes()
    assert bundled == fresh, "regenerate with: python -m tests.sysfs.sample_node"


def test_the_sample_unpacks_to_a_node_with_everything(tmp_path: Path) -> None:
    with sample_node() as (root, snapshot):
        d = discover_at(root, json.loads(snapshot.read_text()))
    assert d.failures == {}
    assert d.interfaces is not None
    assert d.accelerators is not None
    assert len(d.accelerators) == 8
    assert all(a.deviceClass == "h100-80gb-sxm" for a in d.accelerators)
    verdicts = sorted(
        ep.link.verdict for i in d.interfaces for ep in i.endpoints() if ep.link is not None
    )
    assert verdicts.count("Failed") == 1
    assert sum(len(i.virtualFunctions) for i in d.interfaces) == 8
    assert d.labels.desired == {
        keys.RDMA_CAPABLE: "true",
        keys.RDMA_DISTANCE: "PXB",
        keys.RDMA_NUMA: "0_1",
    }
