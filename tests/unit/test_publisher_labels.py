"""The node-label patch rules, and a publisher facing an API server it cannot reach."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.publisher import NodePublisher, label_patch
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import hgx_h100


def test_patch_sets_desired_and_removes_only_stale_managed_keys() -> None:
    live = {
        "fabricdra.io/rdma.capable": "true",
        "fabricdra.io/rdma.numa": "0",
        "fabricdra.io/fabric.domain": "nvlink-x-1",
        "fabricdra.io/other": "x",
        "example.com/foo": "bar",
    }
    desired = {"fabricdra.io/rdma.capable": "true", "fabricdra.io/rdma.numa": "0_1"}
    assert label_patch(live, desired) == {
        "fabricdra.io/rdma.numa": "0_1",
        "fabricdra.io/fabric.domain": None,
    }
    # A key whose inputs could not be read stays as published.
    assert label_patch(live, desired, unknown={"fabricdra.io/fabric.domain"}) == {
        "fabricdra.io/rdma.numa": "0_1"
    }
    # Enumeration failed: additions still go out, nothing is removed.
    assert label_patch(live, {}, enumeration_failed=True) == {}
    assert label_patch(live, dict(live)) == {}


def test_unreachable_server_is_reported_not_raised(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx_h100(b)
    d = discover(SysfsTree(str(b.root)))
    assert d.interfaces is not None
    assert d.accelerators is not None
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"  # nothing listens on the discard port
    cfg.retries = False
    with client.ApiClient(cfg) as api:
        result = NodePublisher(api, "nowhere").sync(d, build_devices(d.interfaces, d.accelerators))
    assert result.writes == {}
    assert set(result.errors) == {"Node", "ResourceSlice", "NodeDevices"}
    assert all(result.errors.values())
