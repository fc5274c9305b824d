"""The verification image's recipe (deployments/verification/build.sh --dry-run): Debian's
perftest and the RDMA providers, `sh` as the entry point, the tools added from a folder. The
build itself needs root, mmdebstrap and umoci (minutes): not run here."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deployments" / "verification" / "build.sh"


def _recipe(*args: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [str(BUILD), "--dry-run", *args], capture_output=True, text=True, check=True, timeout=60
    )
    out: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


def test_the_recipe_takes_perftest_from_debian_and_adds_the_tools_given() -> None:
    plain = _recipe()
    assert plain["suite"] == ["bookworm"]
    packages = plain["packages"][0].split(",")
    assert "perftest" in packages  # ib_write_bw
    assert "ibverbs-providers" in packages  # libibverbs' mlx5 driver
    assert "python3" not in packages
    # The controller's multi-node NVLink check: mpirun over sshd in its worker pods.
    assert {"openmpi-bin", "openssh-server", "openssh-client"} <= set(packages)
    assert "add" not in plain
    assert plain["entrypoint"] == ["sh"]
    standins = REPO / "tests" / "standins"
    harness = _recipe("--add", str(standins), "--python")
    assert "python3" in harness["packages"][0].split(",")
    added = {line.split()[1] for line in harness["add"]}
    assert {
        "/usr/local/bin/nvbandwidth",
        "/usr/local/bin/ib_write_bw",
        "/usr/local/bin/all_reduce_perf",
        "/usr/local/bin/_standin.py",
        "/usr/local/bin/mpirun",
        "/usr/local/bin/nvbandwidth-multinode",
    } <= added
