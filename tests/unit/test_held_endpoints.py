"""How prepared claims hold each device, read from checkpoint entries: what the agent keeps
offering a held NIC as when the node's RDMA mode changes (issue 20 point 4)."""

from __future__ import annotations

from fabricdra.kubeletplugin.agent import held_endpoints
from fabricdra.kubeletplugin.kubelet.checkpoint import ClaimEntry, PreparedRecord


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
