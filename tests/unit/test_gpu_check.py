"""e2e/gpu/check.sh (issue 19 point 12) against a recorded GPU host, until a GPU host is lent:
the bundled HGX H100 sample (sysfs tree and NVML answers, plus the driver and CUDA versions NVML
reports there) and a stand-in `nvidia-smi` on PATH printing that host's recorded outputs
(tests/gpu/). It must agree with fabricdra fact by fact, exit non-zero on a disagreement, and
make nothing but queries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricdra.kubeletplugin.samples import sample_node

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "e2e" / "gpu" / "check.sh"
STAND_IN = REPO / "tests" / "gpu"
RECORDED = STAND_IN / "recorded-hgx-h100"
FACTS = ("uuid", "pciBusId", "numaNode", "migMode", "nvlink", "driverVersion", "cudaVersion")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The recorded host's sysfs root and NVML snapshot (with NVML's driver/CUDA answers),
    unpacked once for the module: the check only reads them."""
    with sample_node() as (sysfs, snapshot):
        recorded = json.loads(Path(snapshot).read_text())
        for gpu in recorded.values():
            gpu["driverVersion"] = "550.54.15"
            gpu["cudaDriverVersion"] = 12040
        nvml = tmp_path_factory.mktemp("host") / "nvml.json"
        nvml.write_text(json.dumps(recorded))
        yield Path(sysfs), nvml


def _check(
    tmp_path: Path, sysfs: Path, nvml: Path, recorded: Path
) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "nvidia-smi.log"
    env = {
        **os.environ,
        "PATH": f"{STAND_IN}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "FABRICDRA": str(Path(sys.executable).parent / "fabricdra"),
        "NVIDIA_SMI_RECORDED": str(recorded),
        "NVIDIA_SMI_LOG": str(log),
    }
    return subprocess.run(
        [
            str(CHECK),
            "--workdir",
            str(tmp_path / "work"),
            "--sysfs-root",
            str(sysfs),
            "--nvml-snapshot",
            str(nvml),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    out = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0] != "gpu":
            out[(cells[0], cells[1])] = cells[2:]
    return out


def test_check_agrees_with_nvidia_smi_on_the_recorded_host(
    tmp_path: Path, host: tuple[Path, Path]
) -> None:
    sysfs, nvml = host
    done = _check(tmp_path, sysfs, nvml, RECORDED)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(done.stdout)
    assert rows[("all", "count")] == ["8", "8", "ok"]
    gpus = {gpu for gpu, _ in rows} - {"all"}
    assert len(gpus) == 8
    for gpu in gpus:
        for fact in FACTS:
            assert rows[(gpu, fact)][2] == "ok", (gpu, fact, rows[(gpu, fact)])
    # The facts compared are real ones, not blanks on both sides.
    assert rows[("0000:cd:00.0", "migMode")][:2] == ["enabled", "enabled"]
    assert rows[("0000:9a:00.0", "numaNode")][:2] == ["1", "1"]
    assert rows[("0000:18:00.0", "nvlink")][:2] == ["18/18", "18/18"]
    assert rows[("0000:18:00.0", "driverVersion")][:2] == ["550.54.15", "550.54.15"]
    assert rows[("0000:18:00.0", "cudaVersion")][:2] == ["12.4", "12.4"]
    # Read-only: every nvidia-smi call was one of the queries.
    calls = (tmp_path / "nvidia-smi.log").read_text().splitlines()
    assert calls
    for call in calls:
        assert call == "" or call.startswith(("--query-gpu=", "topo -m", "nvlink --status -i "))


@pytest.mark.parametrize(
    ("edit", "row"),
    [
        (("query.csv", "GPU-00000003-", "GPU-0000000f-"), ("0000:5c:00.0", "uuid")),
        (("query.csv", "00000000:9A:00.0, Disabled", "00000000:9A:00.0, Enabled"), None),
        (("nvidia-smi.txt", "CUDA Version: 12.4", "CUDA Version: 12.8"), None),
    ],
)
def test_check_exits_non_zero_on_a_disagreement(
    tmp_path: Path,
    host: tuple[Path, Path],
    edit: tuple[str, str, str],
    row: tuple[str, str] | None,
) -> None:
    sysfs, nvml = host
    recorded = tmp_path / "recorded"
    shutil.copytree(RECORDED, recorded)
    name, old, new = edit
    text = (recorded / name).read_text()
    assert old in text
    (recorded / name).write_text(text.replace(old, new))
    done = _check(tmp_path, sysfs, nvml, recorded)
    assert done.returncode != 0, done.stdout
    assert "DIFFERENT" in done.stdout
    assert "disagreement" in done.stderr
    if row is not None:
        assert _rows(done.stdout)[row][2] == "DIFFERENT"


def test_check_counts_a_gpu_nvidia_smi_sees_and_fabricdra_does_not(
    tmp_path: Path, host: tuple[Path, Path]
) -> None:
    sysfs, nvml = host
    recorded = tmp_path / "recorded"
    shutil.copytree(RECORDED, recorded)
    with (recorded / "query.csv").open("a") as f:
        f.write(
            "8, GPU-00000008-5b0e-4c1a-9f3e-a1b2c3d4e5f8, 00000000:DE:00.0, Disabled, 550.54.15\n"
        )
    done = _check(tmp_path, sysfs, nvml, recorded)
    assert done.returncode != 0
    rows = _rows(done.stdout)
    assert rows[("all", "count")] == ["8", "9", "DIFFERENT"]


def test_driver_versions_compare_in_fabricdras_semver_form() -> None:
    """nvidia-smi prints 580.159.04; fabricdra publishes 580.159.4 (seen on a real H200)."""
    from e2e.gpu.compare import semver

    assert semver("580.159.04") == "580.159.4"
    assert semver("570.86.10") == "570.86.10"
    assert semver("N/A") == "N/A"


def test_no_numa_node_agrees_only_where_the_kernel_gives_none(tmp_path: Path) -> None:
    from e2e.gpu.compare import _numa_row, kernel_numa

    bus = "0000:00:06.0"
    function = tmp_path / "bus/pci/devices" / bus
    function.mkdir(parents=True)
    (function / "numa_node").write_text("-1\n")
    assert _numa_row(bus, "-", "0", kernel_numa(tmp_path, bus)).agrees
    (function / "numa_node").write_text("1\n")  # the kernel names one: fabricdra must too
    assert not _numa_row(bus, "-", "1", kernel_numa(tmp_path, bus)).agrees
    assert not _numa_row(bus, "-", "0", kernel_numa(tmp_path / "missing", bus)).agrees
