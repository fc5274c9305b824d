"""The plugin checkpoint: what it keeps across restarts and what it drops across boots."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from fabricdra.kubeletplugin.devices import DeviceInventory
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import (
    LOCK_TIMEOUT,
    Checkpoint,
    CheckpointError,
    CheckpointLockTimeout,
    ClaimEntry,
    PreparedRecord,
    current_boot_id,
    current_boot_time,
)
from fabricdra.kubeletplugin.prepare import CDI_KIND, DevicesDriver

RECORD = PreparedRecord(
    device_name="rdma-0000-19-00-0",
    base_name="rdma-0000-19-00-0",
    cdi_device_ids=("k8s.devices.fabricdra.io/device=rdma-0000-19-00-0-u1",),
    request_names=("nic",),
    share_id=None,
)
ENTRY = ClaimEntry("u1", "ns", "c", ("/run/cdi/x_u1.json",), devices=(RECORD,), consumers=("p",))


def test_entries_and_their_devices_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, boot_id="b1").put(ENTRY)
    again = Checkpoint(path, boot_id="b1")
    assert again.get("u1") == ENTRY
    assert again.dropped == []
    assert json.loads(path.read_text())["bootId"] == "b1"


def test_entries_of_another_boot_are_dropped_and_listed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, boot_id="b1").put(ENTRY)
    after_reboot = Checkpoint(path, boot_id="b2")
    assert after_reboot.entries() == []
    assert after_reboot.dropped == [ENTRY]


def test_an_unknown_boot_id_drops_nothing(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, boot_id="b1").put(ENTRY)
    assert Checkpoint(path, boot_id=None).get("u1") == ENTRY  # unreadable now: not a reboot
    # and a file without a boot id (written where none could be read) is kept too
    Checkpoint(tmp_path / "other.json", boot_id=None).put(ENTRY)
    assert Checkpoint(tmp_path / "other.json", boot_id="b2").get("u1") == ENTRY


def test_a_version_1_checkpoint_is_read_without_devices(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    old = {"uid": "u1", "namespace": "ns", "name": "c", "cdiSpecs": ["/run/cdi/x_u1.json"]}
    path.write_text(json.dumps({"version": 1, "claims": [old]}))
    entry = Checkpoint(path, boot_id="b1").get("u1")
    assert entry == ClaimEntry("u1", "ns", "c", ("/run/cdi/x_u1.json",), devices=None)


def test_an_unknown_version_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 9, "claims": []}))
    with pytest.raises(CheckpointError, match="version 9"):
        Checkpoint(path)


def test_remove_if_leaves_an_entry_that_changed(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.put(ENTRY)
    newer = ClaimEntry("u1", "ns", "c", (), devices=())
    cp.put(newer)
    assert not cp.remove_if(ENTRY)
    assert cp.get("u1") == newer
    assert cp.remove_if(newer)
    assert cp.get("u1") is None


def test_the_boot_id_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("1c6f0c7e-4e39-4b0a-a0a4-2a3d9a0e0a51\n")
    assert current_boot_id(tmp_path / "boot_id") == "1c6f0c7e-4e39-4b0a-a0a4-2a3d9a0e0a51"
    assert current_boot_id(tmp_path / "missing") is None


def test_a_torn_checkpoint_of_an_earlier_boot_is_set_aside(tmp_path: Path) -> None:
    """Nothing is fsynced: a machine crash may leave a torn file, last written before the
    boot that follows. Its entries are of another boot anyway, so the plugin starts empty and
    keeps the file for a person to read, instead of refusing to start."""
    path = tmp_path / "checkpoint.json"
    path.write_text('{"version": 2, "claims": [{"uid"')
    os.utime(path, (1_000, 1_000))
    cp = Checkpoint(path, boot_id="b2", boot_time=2_000.0)
    assert cp.entries() == []
    assert not path.exists()
    assert (tmp_path / "checkpoint.json.unreadable").read_text().startswith('{"version": 2')
    cp.put(ENTRY)  # and it works from there
    assert Checkpoint(path, boot_id="b2", boot_time=2_000.0).get("u1") == ENTRY


def test_a_torn_checkpoint_of_this_boot_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text('{"version": 2, "claims": [{"uid"')
    os.utime(path, (3_000, 3_000))
    with pytest.raises(CheckpointError, match="cannot be read"):
        Checkpoint(path, boot_id="b2", boot_time=2_000.0)
    assert path.exists()


def test_boot_time_from_the_kernel(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nbtime 1764720000\nprocesses 5\n")
    assert current_boot_time(stat) == 1764720000.0
    assert current_boot_time(tmp_path / "missing") is None


def _put_many(path: str, prefix: str, count: int) -> None:
    """One agent process recording claims (run in a child process)."""
    checkpoint = Checkpoint(path, boot_id="b1")
    for i in range(count):
        with checkpoint.exclusive():
            checkpoint.put(ClaimEntry(f"{prefix}{i}", "ns", f"c{i}", ()))


def test_two_processes_sharing_one_checkpoint_lose_no_entry(tmp_path: Path) -> None:
    """During a rolling update two agent pods serve kubelet for a moment and share the
    checkpoint: each change is made on the file's current content under a file lock, so
    neither overwrites what the other recorded."""
    path = tmp_path / "checkpoint.json"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_put_many, args=(str(path), p, 30)) for p in ("old", "new")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    uids = {e.uid for e in Checkpoint(path, boot_id="b1").entries()}
    assert uids == {f"{p}{i}" for p in ("old", "new") for i in range(30)}


def test_a_change_made_by_another_instance_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    old, new = Checkpoint(path, boot_id="b1"), Checkpoint(path, boot_id="b1")
    old.put(ENTRY)
    assert new.get("u1") == ENTRY  # prepared by the old pod, unprepared by the new one
    assert new.remove("u1")
    assert old.get("u1") is None
    assert old.entries() == []


def test_a_held_lock_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    """Another holder of `<checkpoint>.lock` (a stuck agent pod of a rolling update) makes a
    change fail with an error naming the lock once `lock_timeout` has passed, instead of
    blocking kubelet's call for ever."""
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="b1", lock_timeout=0.2)
    holder = os.open(cp.lock_path, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(CheckpointLockTimeout, match=r"checkpoint\.json\.lock"):
            cp.put(ENTRY)
    finally:
        os.close(holder)
    cp.put(ENTRY)  # free again: it works
    assert cp.get("u1") == ENTRY


def test_the_lock_waits_ten_seconds_by_default() -> None:
    assert LOCK_TIMEOUT == 10.0  # NVIDIA's GPU driver bounds its checkpoint flock the same


def test_an_unknown_version_of_another_boot_is_set_aside(tmp_path: Path) -> None:
    """A newer plugin wrote it before a reboot, then the node came back with this version:
    its entries belong to a boot whose containers are gone, so the file is kept aside for a
    person and the plugin starts empty."""
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 9, "bootId": "b1", "claims": [{"x": 1}]}))
    cp = Checkpoint(path, boot_id="b2")
    assert cp.entries() == []
    assert not path.exists()
    assert json.loads((tmp_path / "checkpoint.json.unreadable").read_text())["version"] == 9


def test_an_unknown_version_written_before_this_boot_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 9, "claims": []}))
    os.utime(path, (1_000, 1_000))
    assert Checkpoint(path, boot_id="b2", boot_time=2_000.0).entries() == []
    assert (tmp_path / "checkpoint.json.unreadable").exists()


def test_an_unknown_version_of_this_boot_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 9, "bootId": "b2", "claims": []}))
    with pytest.raises(CheckpointError, match="version 9"):
        Checkpoint(path, boot_id="b2")
    assert path.exists()


class _NoApi:
    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        raise AssertionError("start-up reads no claim")


def test_a_stale_checkpoint_never_deletes_outside_the_cdi_folder(tmp_path: Path) -> None:
    """Entries of another boot have their spec files removed at start-up — only files of
    the driver's own name pattern directly in its CDI folder, whatever else the file names
    (a checkpoint edited by hand, copied from another node, or of another install)."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    ours = cdi / f"{CDI_KIND.replace('/', '-')}_u1.json"
    ours.write_text("{}")
    outside = tmp_path / "etc-passwd"
    outside.write_text("root")
    escaped = cdi / ".." / "escaped.json"
    (tmp_path / "escaped.json").write_text("{}")
    foreign = cdi / "nvidia.com-gpu.json"  # the toolkit's spec, in the same folder
    foreign.write_text("{}")
    entry = ClaimEntry("u1", "ns", "c", tuple(map(str, (outside, escaped, foreign, ours))))
    Checkpoint(tmp_path / "checkpoint.json", boot_id="b1").put(entry)
    driver = DevicesDriver(
        node_name="node-a",
        inventory=lambda: DeviceInventory(()),
        claims=_NoApi(),
        cdi=CdiWriter(cdi, CDI_KIND),
        checkpoint=Checkpoint(tmp_path / "checkpoint.json", boot_id="b2"),
    )
    assert driver.checkpoint.dropped == [entry]
    assert outside.read_text() == "root"
    assert (tmp_path / "escaped.json").exists()
    assert foreign.exists()
    assert not ours.exists()
