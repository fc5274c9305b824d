"""Dynamic MIG instance lifecycle over a fake NVML that keeps the H100's placement rules:
created at the placement asked, destroyed on release, adopted (static) instances never
destroyed, and a crash between creation and record never leaks one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabricdra.kubeletplugin.kinds.nvidia.dynamicmig import (
    DynamicMig,
    DynamicMigError,
    MigLeftBehind,
)
from tests.nvmlfake.mig import Crash, FakeMigGpu, FakeNvml, NvmlError

BUS = "0000:1b:00.0"


def _setup(tmp_path: Path) -> tuple[FakeNvml, DynamicMig]:
    nvml = FakeNvml({BUS: FakeMigGpu.h100_80gb()})
    return nvml, DynamicMig(nvml, tmp_path / "mig-journal.json")


def _placements(nvml: FakeNvml) -> list[tuple[str, int]]:
    return sorted((gi.profile, gi.start) for gi in nvml.gpus[BUS].instances.values())


def test_create_then_destroy(tmp_path: Path) -> None:
    nvml, mig = _setup(tmp_path)
    made = mig.create("claim-a", "mig-0000-1b-00-0-3g-40gb-m4", BUS, "3g.40gb", 4)
    assert (made.profile, made.start) == ("3g.40gb", 4)
    assert _placements(nvml) == [("3g.40gb", 4)]
    # a repeated prepare gets the same instance, not a second one
    assert mig.create("claim-a", "mig-0000-1b-00-0-3g-40gb-m4", BUS, "3g.40gb", 4) == made
    assert _placements(nvml) == [("3g.40gb", 4)]
    assert mig.destroy("claim-a") == ["mig-0000-1b-00-0-3g-40gb-m4"]
    assert _placements(nvml) == []
    assert mig.records() == []


def test_another_claim_cannot_take_a_held_placement(tmp_path: Path) -> None:
    _, mig = _setup(tmp_path)
    mig.create("claim-a", "dev", BUS, "3g.40gb", 4)
    with pytest.raises(DynamicMigError, match="held by claim claim-a"):
        mig.create("claim-b", "dev", BUS, "3g.40gb", 4)


def test_nvml_refusal_leaves_no_record(tmp_path: Path) -> None:
    nvml, mig = _setup(tmp_path)
    mig.create("claim-a", "a", BUS, "4g.40gb", 0)
    with pytest.raises(NvmlError):
        mig.create("claim-b", "b", BUS, "3g.40gb", 0)  # overlaps the 4g: NVML says no
    assert [r.device for r in mig.records()] == ["a"]
    assert _placements(nvml) == [("4g.40gb", 0)]


def test_adopted_instance_is_never_destroyed(tmp_path: Path) -> None:
    nvml, mig = _setup(tmp_path)
    static = nvml.gpus[BUS].create("3g.40gb", 4)  # existed before the agent started
    mig.create("claim-a", "a", BUS, "4g.40gb", 0)
    assert mig.destroy("claim-a") == ["a"]
    assert mig.destroy("claim-of-the-static-one") == []
    assert mig.recover() == []
    assert list(nvml.gpus[BUS].instances) == [static.id]


def test_crash_between_creation_and_record_leaks_nothing(tmp_path: Path) -> None:
    nvml, mig = _setup(tmp_path)
    nvml.crash_after_create = True
    with pytest.raises(Crash):
        mig.create("claim-a", "a", BUS, "3g.40gb", 4)
    assert _placements(nvml) == [("3g.40gb", 4)]  # NVML made it; nobody learnt its ids
    static = nvml.gpus[BUS].create("3g.40gb", 0)  # an instance the journal does not name
    restarted = DynamicMig(nvml, tmp_path / "mig-journal.json")
    assert restarted.recover() == ["a"]
    assert list(nvml.gpus[BUS].instances) == [static.id]
    assert restarted.records() == []


def test_unreadable_journal_is_an_error_not_empty(tmp_path: Path) -> None:
    _, mig = _setup(tmp_path)
    (tmp_path / "mig-journal.json").write_text("{torn")
    with pytest.raises(DynamicMigError, match="cannot be read"):
        mig.records()


def test_recover_never_destroys_an_instance_that_took_our_id(tmp_path: Path) -> None:
    """After a reboot (or `nvidia-smi mig -dgi` behind our back) the GPU instance id our
    record names can belong to an administrator's instance: not ours, so not destroyed; the
    record is dropped."""
    nvml, mig = _setup(tmp_path)
    made = mig.create("claim-a", "a", BUS, "3g.40gb", 4)
    gpu = nvml.gpus[BUS]
    gpu.destroy(made.gpu_instance)
    gpu._next_id = made.gpu_instance  # NVML hands out the lowest free id again
    theirs = gpu.create("3g.40gb", 4)
    assert theirs.id == made.gpu_instance
    assert mig.recover() == ["a"]
    assert mig.destroy("claim-a") == []
    assert list(gpu.instances) == [theirs.id]
    assert mig.records() == []


class LeavesHalf(FakeNvml):
    """NVML made the GPU instance, the compute instance failed, and destroying the GPU
    instance failed too (what LiveMigNvml raises then)."""

    def create(self, bus: str, profile: str, start: int) -> Any:
        self.gpus[bus].create(profile, start)
        raise MigLeftBehind("compute instance: insufficient resources; destroy: in use")


def test_a_half_made_instance_keeps_its_intent_for_recover(tmp_path: Path) -> None:
    nvml = LeavesHalf({BUS: FakeMigGpu.h100_80gb()})
    mig = DynamicMig(nvml, tmp_path / "mig-journal.json")
    with pytest.raises(MigLeftBehind):
        mig.create("claim-a", "a", BUS, "2g.20gb", 4)
    assert [(r.device, r.created) for r in mig.records()] == [("a", None)]
    assert mig.recover() == ["a"]
    assert nvml.gpus[BUS].instances == {}
