"""The IMEX daemon's requests (issue 11 point 4): the DaemonSet carries the figures
docs/compute-domains.md documents (sized from bench/imexdaemon.py), they can be changed with
the controller's flags and the chart, and a bad value is refused naming the flag."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.computedomain import ComputeDomain
from fabricdra.controller import objects
from fabricdra.controller.objects import DaemonSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compute-domains.md"
VALUES = Path(__file__).resolve().parents[2] / "charts" / "fabricdra" / "values.yaml"


def _domain() -> ComputeDomain:
    return ComputeDomain.model_validate(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "uid-a"},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}},
        }
    )


def _resources(settings: DaemonSettings) -> dict[str, object]:
    ds = objects.daemon_set(_domain(), settings)
    container = ds["spec"]["template"]["spec"]["containers"][0]
    return dict(container["resources"])


def _documented() -> tuple[str, str, str]:
    """The sizing the docs state: "requests: cpu `X`, memory `Y`; limit: memory `Z`"."""
    text = DOCS.read_text()
    found = re.search(
        r"requests: cpu `([^`]+)`,\s+memory `([^`]+)`;\s+limit: memory `([^`]+)`", text
    )
    assert found, "docs/compute-domains.md states no IMEX daemon sizing"
    return found.group(1), found.group(2), found.group(3)


def test_the_daemon_set_carries_the_documented_sizing() -> None:
    """Issue 29, point 11: requests for what was measured, a memory limit far above it (a
    leak is stopped, the unmeasured nvidia-imex is not OOM-killed), no CPU limit."""
    cpu, memory, limit = _documented()
    res = _resources(DaemonSettings())
    assert res["requests"] == {"cpu": cpu, "memory": memory}
    assert res["limits"] == {"memory": limit}
    assert res["claims"] == [{"name": "imex"}]
    # The chart's defaults are the same figures.
    values = VALUES.read_text()
    assert f"cpu: {cpu}" in values
    assert f"memory: {memory}" in values
    assert f"memoryLimit: {limit}" in values


def test_the_sizing_is_configurable() -> None:
    res = _resources(DaemonSettings(cpu="250m", memory="256Mi", memory_limit="2Gi"))
    assert res["requests"] == {"cpu": "250m", "memory": "256Mi"}
    assert res["limits"] == {"memory": "2Gi"}


def test_a_memory_limit_below_the_request_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from fabricdra.cli import main

    argv = ["controller", "--imex-daemon-memory", "512Mi", "--imex-daemon-memory-limit", "256Mi"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--imex-daemon-memory-limit (256Mi) must be at least --imex-daemon-memory" in err


def _probes() -> dict[str, Any]:
    ds = objects.daemon_set(_domain(), DaemonSettings())
    container = ds["spec"]["template"]["spec"]["containers"][0]
    return {k: container[k] for k in ("startupProbe", "livenessProbe", "readinessProbe")}


def _run_probe(probe: dict[str, Any], config_dir: Path) -> int:
    """The probe's command as kubelet runs it in the container, with the container's /imexd
    at `config_dir` (the same Debian sh, date, stat and test as the image's)."""
    command = [c.replace(objects.CONFIG_DIR, str(config_dir)) for c in probe["exec"]["command"]]
    return subprocess.run(command, check=False, capture_output=True).returncode


def test_the_probes_answer_from_the_daemons_files(tmp_path: Path) -> None:
    """Issue 29, point 11: the DaemonSet had a readiness probe only (NVIDIA's has startup,
    liveness and readiness). Startup: the daemon's loop has turned once (`alive` exists);
    liveness: the loop still turns (`alive` younger than ALIVE_WITHIN_SECONDS; a stuck daemon
    is restarted by kubelet); readiness: IMEX answers READY (`ready`). Run against real
    files with real mtimes."""
    probes = _probes()
    startup, liveness, readiness = (
        probes["startupProbe"],
        probes["livenessProbe"],
        probes["readinessProbe"],
    )
    alive, ready = tmp_path / "alive", tmp_path / "ready"
    assert _run_probe(startup, tmp_path) != 0
    assert _run_probe(liveness, tmp_path) != 0
    assert _run_probe(readiness, tmp_path) != 0
    alive.touch()
    assert _run_probe(startup, tmp_path) == 0
    assert _run_probe(liveness, tmp_path) == 0
    assert _run_probe(readiness, tmp_path) != 0  # alive, IMEX not READY: not restarted
    stale = time.time() - objects.ALIVE_WITHIN_SECONDS - 5
    os.utime(alive, (stale, stale))
    assert _run_probe(liveness, tmp_path) != 0  # the loop stopped turning: restart
    ready.write_text("READY\n")
    assert _run_probe(readiness, tmp_path) == 0
    # Liveness is asked only after startup, and gives a stuck daemon three tries.
    assert liveness["failureThreshold"] >= 3
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 120


@pytest.mark.parametrize(
    ("flag", "value"), [("--imex-daemon-cpu", "lots"), ("--imex-daemon-memory", "128 MB")]
)
def test_a_bad_quantity_is_refused_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fabricdra.cli import main

    assert main(["controller", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fabricdra controller: {flag} must be a Kubernetes quantity")
    assert repr(value) in err


def test_the_pull_policy_is_the_controllers_setting() -> None:
    ds = objects.daemon_set(_domain(), DaemonSettings(image_pull_policy="Always"))
    assert ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    default = objects.daemon_set(_domain(), DaemonSettings())
    assert default["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == (
        "IfNotPresent"
    )
