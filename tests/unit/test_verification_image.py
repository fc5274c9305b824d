"""The verification image's recipe (deployments/verification/build.sh --dry-run): Debian's
perftest and the RDMA providers, `sh` as the entry point, the tools added from a folder. The
build itself needs root, mmdebstrap and umoci (minutes): not run here."""

from __future__ import annotations

import platform
import shutil
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


# One verification.image for a fleet of x86_64 nodes and Grace (aarch64) trays: the image is
# built per platform, and machine code goes only into the platform it was built for.
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _host_and_other() -> tuple[str, str]:
    host = _ARCH[platform.machine()]
    return host, "arm64" if host == "amd64" else "amd64"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUILD), "--dry-run", *args], capture_output=True, text=True, timeout=60
    )


def test_two_platforms_are_one_recipe_each_and_an_unknown_platform_is_refused() -> None:
    both = _recipe("--platform", "linux/amd64,linux/arm64")
    assert both["platform"] == ["linux/amd64", "linux/arm64"]
    host, _ = _host_and_other()
    assert _recipe()["platform"] == [f"linux/{host}"]  # default: this machine's
    wrong = _run("--platform", "linux/s390x")
    assert wrong.returncode == 2
    assert "unsupported platform 'linux/s390x'" in wrong.stderr


def test_machine_code_goes_only_into_its_own_platform(tmp_path: Path) -> None:
    host, other = _host_and_other()
    tool = Path(shutil.which("true") or "/bin/true")  # an ELF executable of this machine
    tools = tmp_path / "tools"
    (tools / host).mkdir(parents=True)
    shutil.copy(tool, tools / host / "nvbandwidth")
    (tools / "probe.sh").write_text("#!/bin/sh\n")  # a script serves every platform
    both = _recipe("--platform", "linux/amd64,linux/arm64", "--add", str(tools))
    added = sorted((line.split()[1], line.split()[2]) for line in both["add"])
    assert added == sorted(
        [
            ("/usr/local/bin/nvbandwidth", f"linux/{host}"),
            ("/usr/local/bin/probe.sh", "linux/amd64"),
            ("/usr/local/bin/probe.sh", "linux/arm64"),
        ]
    )
    # the same executable in the other platform's folder, or at the top of a two-platform
    # build: refused by name
    (tools / other).mkdir()
    shutil.copy(tool, tools / other / "nvbandwidth")
    wrong = _run("--platform", f"linux/{other}", "--add", str(tools))
    assert wrong.returncode != 0
    assert f"{tools / other / 'nvbandwidth'} is ELF for machine" in wrong.stderr
    top = tmp_path / "top"
    top.mkdir()
    shutil.copy(tool, top / "all_reduce_perf")
    assert _recipe("--add", str(top))["add"]  # one platform, its own machine: taken as it is
    loose = _run("--platform", "linux/amd64,linux/arm64", "--add", str(top))
    assert loose.returncode != 0
    assert f"{top / 'all_reduce_perf'} is machine code: put it under" in loose.stderr
