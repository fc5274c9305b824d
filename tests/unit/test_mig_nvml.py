"""The live dynamic MIG creator (kubeletplugin/.../mignvml.py) through the real pynvml, against
a C library with NVML's signatures that keeps the H100's (or H200's) placement rules
(tests/nvmlfake/libnvml_mig.c, loaded as libnvidia-ml.so.1 the way pynvml loads NVML).

Each scenario runs in a child process: a structure passed the wrong way (by value where NVML
reads a pointer) kills the process that makes the call, as it did on a real H200. The
stand-in keeps its instances in a file, so they outlive a process as on a GPU (a crash, then
a restarted agent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.nvmlfake import standin

BUS = "0000:1b:00.0"


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build(tmp_path_factory.mktemp("nvml-h100"), "h100")


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build(tmp_path_factory.mktemp("nvml-h200"), "h200")


PRELUDE = """
import json, os, sys
from pathlib import Path
from fabricdra.kubeletplugin.kinds.nvidia.dynamicmig import DynamicMig
from fabricdra.kubeletplugin.kinds.nvidia.mignvml import LiveMigNvml
BUS = "0000:1b:00.0"
live = LiveMigNvml()
def placements():
    return sorted([i.profile, i.start, i.compute_instance] for i in live.instances(BUS))
"""


def run(lib: Path, state: Path, body: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LD_LIBRARY_PATH": str(lib), "FAKE_NVML_STATE": str(state), **env},
    )


def answer(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_creates_the_placement_asked_and_destroys_it(h100: Path, tmp_path: Path) -> None:
    out = answer(
        run(
            h100,
            tmp_path / "gpu",
            """
            made = live.create(BUS, "3g.40gb", 4)
            after = placements()
            live.destroy(BUS, made.gpu_instance)
            print(json.dumps([made.__dict__, after, placements()]))
            """,
        )
    )
    made, after, gone = out
    # the placement reached NVML through its pointer: the instance sits at memory slice 4
    assert made == {
        "gpu_instance": 1,
        "compute_instance": 0,
        "uuid": "MIG-fake-gi1-ci0-m4",
        "profile": "3g.40gb",
        "start": 4,
    }
    assert after == [["3g.40gb", 4, 0]]
    assert gone == []


def test_h200_profiles_are_created_by_their_own_names(h200: Path, tmp_path: Path) -> None:
    out = answer(
        run(
            h200,
            tmp_path / "gpu",
            """
            live.create(BUS, "3g.71gb", 4)
            live.create(BUS, "2g.35gb", 2)
            live.create(BUS, "1g.18gb", 0)
            print(json.dumps(placements()))
            """,
        )
    )
    assert out == [["1g.18gb", 0, 0], ["2g.35gb", 2, 0], ["3g.71gb", 4, 0]]


def test_an_overlapping_placement_is_refused_and_leaves_nothing(h100: Path, tmp_path: Path) -> None:
    out = answer(
        run(
            h100,
            tmp_path / "gpu",
            """
            import pynvml
            live.create(BUS, "4g.40gb", 0)
            try:
                live.create(BUS, "3g.40gb", 0)  # memory slices 0-3 are the 4g's
                refused = None
            except pynvml.NVMLError as e:
                refused = str(e)
            print(json.dumps([refused, placements()]))
            """,
        )
    )
    assert out == ["Insufficient Resources", [["4g.40gb", 0, 0]]]


def test_compute_instance_failure_destroys_the_gpu_instance(h100: Path, tmp_path: Path) -> None:
    out = answer(
        run(
            h100,
            tmp_path / "gpu",
            """
            import pynvml
            try:
                live.create(BUS, "2g.20gb", 4)
                refused = None
            except pynvml.NVMLError as e:
                refused = str(e)
            print(json.dumps([refused, placements()]))
            """,
            FAKE_NVML_FAIL_CI="1",
        )
    )
    assert out == ["Insufficient Resources", []]


def test_a_placement_passed_by_value_does_not_reach_nvml(h100: Path, tmp_path: Path) -> None:
    """The stand-in is as strict as NVML: the structure by value (pynvml passes it on as
    given) is not read as the placement — the process dies or NVML refuses — so the
    byref in mignvml is what the tests above prove."""
    done = run(
        h100,
        tmp_path / "gpu",
        """
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByPciBusId(BUS.encode())
        placement = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
        try:
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, placement)
        except pynvml.NVMLError:
            pass
        print(json.dumps(placements()))
        """,
    )
    assert done.returncode != 0 or answer(done) == []


CRASH = """
class DiesAfterCreating(LiveMigNvml):
    def create(self, bus, profile, start):
        super().create(bus, profile, start)
        os._exit(9)  # the agent killed after NVML made the instance, before its ids are saved
"""


def test_crash_between_intent_and_ids_then_recover_destroys_it(h100: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal.json"
    static = answer(
        run(
            h100,
            tmp_path / "gpu",
            """
            made = live.create(BUS, "1g.10gb", 0)  # the administrator's: no journal names it
            print(json.dumps(made.gpu_instance))
            """,
        )
    )
    died = run(
        h100,
        tmp_path / "gpu",
        CRASH
        + f"""
DynamicMig(DiesAfterCreating(), Path({str(journal)!r})).create("claim-a", "a", BUS, "3g.40gb", 4)
""",
    )
    assert died.returncode == 9, died.stderr
    out = answer(
        run(
            h100,
            tmp_path / "gpu",
            f"""
            before = placements()
            mig = DynamicMig(live, Path({str(journal)!r}))
            touched = mig.recover()
            print(json.dumps([before, touched, placements(), len(mig.records()),
                              [i.gpu_instance for i in live.instances(BUS)]]))
            """,
        )
    )
    before, touched, after, records, left = out
    assert before == [["1g.10gb", 0, 0], ["3g.40gb", 4, 0]]
    assert touched == ["a"]
    assert after == [["1g.10gb", 0, 0]]
    assert records == 0
    assert left == [static]


def test_unprepare_destroys_only_the_instance_we_created(h100: Path, tmp_path: Path) -> None:
    """A journal record whose GPU instance id now names another instance (ours destroyed
    behind our back, the id given to an administrator's new one) never destroys that one."""
    journal = tmp_path / "journal.json"
    out = answer(
        run(
            h100,
            tmp_path / "gpu",
            f"""
            mig = DynamicMig(live, Path({str(journal)!r}))
            made = mig.create("claim-a", "a", BUS, "3g.40gb", 4)
            live.destroy(BUS, made.gpu_instance)  # not us: nvidia-smi mig -dci -dgi
            theirs = live.create(BUS, "3g.40gb", 0)
            same_id = theirs.gpu_instance == made.gpu_instance
            done = mig.destroy("claim-a")
            print(json.dumps([same_id, done, placements(), mig.records() == []]))
            """,
        )
    )
    assert out == [True, ["a"], [["3g.40gb", 0, 0]], True]


def test_adopted_instance_survives_create_destroy_and_recover(h100: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal.json"
    out = answer(
        run(
            h100,
            tmp_path / "gpu",
            f"""
            static = live.create(BUS, "3g.40gb", 4)
            mig = DynamicMig(live, Path({str(journal)!r}))
            mig.create("claim-a", "a", BUS, "4g.40gb", 0)
            mig.destroy("claim-a")
            mig.destroy("claim-of-nobody")
            mig.recover()
            print(json.dumps(placements()))
            """,
        )
    )
    assert out == [["3g.40gb", 4, 0]]


REPO = Path(__file__).resolve().parents[2]


def check(lib: Path, state: Path, *args: str, mig: str) -> subprocess.CompletedProcess[str]:
    """e2e/gpu/dynamic_mig_check.py as run on a GPU host, NVML being the stand-in."""
    return subprocess.run(
        [sys.executable, "-m", "e2e.gpu.dynamic_mig_check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={
            **os.environ,
            "LD_LIBRARY_PATH": str(lib),
            "FAKE_NVML_STATE": str(state),
            "FAKE_NVML_MIG": mig,
        },
    )


def changes(state: Path) -> list[str]:
    log = Path(f"{state}.log")
    return log.read_text().splitlines() if log.exists() else []


def test_gpu_check_with_mig_disabled_compares_and_changes_nothing(
    h100: Path, tmp_path: Path
) -> None:
    done = check(h100, tmp_path / "gpu", "--create-destroy", mig="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "00000000:1B:00.0 NVIDIA H100 80GB HBM3: h100-80gb: agrees" in done.stdout
    assert "create/destroy: not run (MIG mode Disabled; this check never changes it)" in (
        done.stdout
    )
    assert changes(tmp_path / "gpu") == []


def test_gpu_check_with_mig_enabled_creates_and_destroys_only_when_asked(
    h100: Path, tmp_path: Path
) -> None:
    state = tmp_path / "gpu"
    done = check(h100, state, mig="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "create/destroy: not run (MIG mode Enabled; pass --create-destroy)" in done.stdout
    assert changes(state) == []
    # what the driver shows for the instance each profile gets (gi1/ci0: one at a time)
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    caps = proc / "driver" / "nvidia" / "capabilities" / "gpu0" / "mig" / "gi1"
    (caps / "ci0").mkdir(parents=True)
    (caps / "access").write_text("DeviceFileMinor: 12\nDeviceFileMode: 292\n")
    (caps / "ci0" / "access").write_text("DeviceFileMinor: 13\nDeviceFileMode: 292\n")
    (dev / "nvidia-caps").mkdir(parents=True)
    for minor in (12, 13):
        (dev / "nvidia-caps" / f"nvidia-cap{minor}").touch()
    done = check(
        h100, state, "--create-destroy", "--proc-root", str(proc), "--dev-root", str(dev), mig="1"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    made = [line.strip() for line in done.stdout.splitlines() if "created" in line]
    assert made == [
        f"{name} at {start}: created gi1/ci0 MIG-fake-gi1-ci0-m{start}, destroyed"
        for name, start in (
            ("1g.10gb", 6),
            ("1g.20gb", 6),
            ("2g.20gb", 4),
            ("3g.40gb", 4),
            ("4g.40gb", 0),
            ("7g.80gb", 0),
        )
    ]
    log = changes(state)
    assert [line.split()[0] for line in log] == ["create-gpu-instance", "destroy-gpu-instance"] * 6


def test_gpu_check_leaves_a_gpu_with_instances_alone(h100: Path, tmp_path: Path) -> None:
    state = tmp_path / "gpu"
    answer(run(h100, state, 'live.create(BUS, "1g.10gb", 3)\nprint("null")'))
    before = changes(state)
    done = check(h100, state, "--create-destroy", mig="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not run (the GPU has MIG instances, left alone: 1g.10gb@3)" in done.stdout
    assert changes(state) == before
