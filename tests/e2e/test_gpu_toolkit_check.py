"""The toolkit CDI check's here-mode (issue 32, point 8; e2e/gpu/toolkit_cdi_check.sh): until a
GPU machine runs it against a real driver, the same script runs here against the recorded
`nvidia-ctk cdi generate` spec on the tests' sample node. prepare answers the toolkit's CDI id
for the GPU, the ids resolve into a runc bundle as a CDI runtime resolves them, and a real runc
starts the container: it sees exactly its own GPU's node and the toolkit's control nodes,
NVIDIA_VISIBLE_DEVICES=void and the toolkit's mounts. Root (runc) and the harness's runc."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from e2e.harness.binaries import ensure

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "gpu" / "toolkit_cdi_check.sh"


def test_the_toolkit_cdi_check_runs_here_against_the_recorded_spec(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "runc").symlink_to(ensure(("runc",), node=True) / "runc")
    work = tmp_path / "work"
    done = subprocess.run(
        [str(SCRIPT), "--recorded", "--tools", str(tools), "--workdir", str(work)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((work / "result.json").read_text())
    assert result["problems"] == []
    assert result["cdiDeviceIds"][0] == f"nvidia.com/gpu={result['uuid']}"
    lines = result["output"].splitlines()
    assert sorted(line for line in lines if line.startswith("/dev/nvidia")) == [
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia0",
        "/dev/nvidiactl",
    ]
    assert "NVIDIA_VISIBLE_DEVICES=void" in lines
    config = json.loads((work / "bundle" / "config.json").read_text())
    assert "/usr/bin/nvidia-smi" in {m["destination"] for m in config["mounts"]}
