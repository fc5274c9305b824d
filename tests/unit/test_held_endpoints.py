"""How prepared claims hold each device, read from checkpoint entries: what the agent keeps
offering a held NIC as when the node's RDMA mode changes (issue 20 point 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory, RdmaMode
from fabricdra.kubeletplugin.kinds.rdma.holds import held_endpoints, pins_mode
from fabricdra.kubeletplugin.kubelet.checkpoint import ClaimEntry, PreparedRecord
from tests.integration.kubelethost import Host, build_host

NIC0 = "rdma-0000-19-00-0"
VF60 = "rdma-0000-bd-00-2"  # the first VF of mlx5_6
GPU0 = "gpu-0000-18-00-0"


def _entry(uid: str, *records: PreparedRecord) -> ClaimEntry:
    return ClaimEntry(uid, "ns", uid, (), records)


def _record(device: str, base: str, share_id: str | None = None) -> PreparedRecord:
    return PreparedRecord(device, base, (f"cdi/{device}",), ("r",), share_id)


def test_shares_and_exclusive_holds_are_told_apart() -> None:
    held = held_endpoints(
        [
            _entry("a", _record("rdma-1", "rdma-1")),  # exclusive
            _entry("b", _record("rdma-2-s3", "rdma-2")),  # a 1.34/1.35 holder name
            _entry("c", _record("rdma-3", "rdma-3", share_id="5a1e")),  # a 1.36 share
            _entry("d", _record("rdma-4", "rdma-4", share_id="1"), _record("gpu-1", "gpu-1")),
            _entry("e", _record("rdma-4", "rdma-4")),  # exclusive wins over a share
            ClaimEntry("v1", "ns", "v1", ()),  # a version 1 entry names no devices
        ]
    )
    assert held == {
        "rdma-1": "exclusive",
        "rdma-2": "shared",
        "rdma-3": "shared",
        "rdma-4": "exclusive",
        "gpu-1": "exclusive",
    }


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(Path(tmp_path_factory.mktemp("held")))


def _natural(host: Host, mode: RdmaMode, vfs: bool = True) -> DeviceInventory:
    """What the node's modes alone offer (no holds): what the agent compares holds with."""
    return build_devices(
        host.discovery.interfaces or [],
        host.discovery.accelerators or [],
        DeviceConfig(rdma_mode=mode, rdma_vfs=vfs),
    )


@pytest.mark.parametrize(
    ("mode", "vfs", "record", "pins"),
    [
        ("exclusive", True, _record(NIC0, NIC0), False),  # held as offered: nothing to read
        ("exclusive", True, _record(NIC0, NIC0, share_id="1"), True),  # a share from shared mode
        ("shared", True, _record(NIC0, NIC0), True),  # the e2e case: exclusive on a shared node
        ("shared", True, _record(NIC0, NIC0, share_id="1"), False),
        ("shared", True, _record(f"{NIC0}-s2", NIC0), False),  # a 1.34/1.35 holder name
        ("shared", True, _record(VF60, VF60), False),  # a VF is offered `vf` in any on-mode
        ("exclusive", False, _record(VF60, VF60), True),  # VFs switched off: kept only held
        ("off", True, _record(NIC0, NIC0), True),
        ("off", True, _record(GPU0, GPU0), False),  # GPUs are offered alike held or not
    ],
)
def test_only_a_hold_that_changes_what_is_offered_pins_the_mode(
    host: Host, mode: RdmaMode, vfs: bool, record: PreparedRecord, pins: bool
) -> None:
    assert pins_mode(_entry("a", record), _natural(host, mode, vfs)) is pins
