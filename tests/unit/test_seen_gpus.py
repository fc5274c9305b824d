"""A GPU that fell off the bus is kept across an agent restart while a claim holds it
(issue 29 point 5): `SeenGpus` over a real state file."""

from __future__ import annotations

import json
from pathlib import Path

from fabricdra.api.inventory import Accelerator
from fabricdra.kubeletplugin.devices import gpu_name
from fabricdra.kubeletplugin.kinds.nvidia.seengpus import SeenGpus

A = Accelerator(vendor="nvidia", vendorId="0x10de", pciBusId="0000:18:00.0", productName="H100")
B = Accelerator(vendor="nvidia", vendorId="0x10de", pciBusId="0000:2a:00.0", productName="H100")


def test_a_lost_gpu_is_kept_by_the_process_that_saw_it_held_or_not(tmp_path: Path) -> None:
    seen = SeenGpus(tmp_path / "gpus-seen.json", "boot-1")
    assert seen.update([A, B], held=set()) == []
    assert seen.update([B], held=set()) == [A]
    assert seen.update(None, held=set()) == []  # a failed enumeration loses nothing


def test_after_a_restart_only_a_held_lost_gpu_is_kept_until_released(tmp_path: Path) -> None:
    path = tmp_path / "gpus-seen.json"
    SeenGpus(path, "boot-1").update([A, B], held=set())
    restarted = SeenGpus(path, "boot-1")
    # A left the bus while the agent was down: held (here through a MIG instance's parent)
    assert restarted.update([], held={gpu_name(A)}) == [A]
    assert restarted.update([], held={gpu_name(A)}) == [A]
    assert restarted.update([], held=set()) == []  # released: gone for good
    assert restarted.update([], held={gpu_name(A)}) == []
    # the file keeps no record of a GPU nobody holds and nothing sees any more
    assert [g["pciBusId"] for g in json.loads(path.read_text())["gpus"]] == []


def test_records_of_another_boot_or_unreadable_keep_nothing(tmp_path: Path) -> None:
    path = tmp_path / "gpus-seen.json"
    SeenGpus(path, "boot-1").update([A], held=set())
    assert SeenGpus(path, "boot-2").update([], held={gpu_name(A)}) == []
    path.write_text("{torn")
    assert SeenGpus(path, "boot-2").update([], held={gpu_name(A)}) == []


def test_the_file_is_not_rewritten_when_nothing_changed(tmp_path: Path) -> None:
    path = tmp_path / "gpus-seen.json"
    SeenGpus(path, "boot-1").update([A, B], held=set())
    before = path.stat().st_ino
    restarted = SeenGpus(path, "boot-1")
    restarted.update([A, B], held=set())
    restarted.update([A, B], held=set())
    assert path.stat().st_ino == before  # every write is a rename: a new inode
