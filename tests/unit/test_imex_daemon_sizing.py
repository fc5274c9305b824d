"""The IMEX daemon's requests (issue 11 point 4): the DaemonSet carries the figures
docs/compute-domains.md documents (sized from bench/imexdaemon.py), they can be changed with
the controller's flags and the chart, and a bad value is refused naming the flag."""

from __future__ import annotations

import re
from pathlib import Path

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


def _documented() -> tuple[str, str]:
    """The requests the docs' sizing section states: "requests = limits: cpu `X`, memory `Y`"."""
    text = DOCS.read_text()
    found = re.search(r"requests = limits: cpu `([^`]+)`,\s+memory `([^`]+)`", text)
    assert found, "docs/compute-domains.md states no IMEX daemon requests"
    return found.group(1), found.group(2)


def test_the_daemon_set_carries_the_documented_requests() -> None:
    cpu, memory = _documented()
    res = _resources(DaemonSettings())
    assert res["requests"] == {"cpu": cpu, "memory": memory}
    assert res["limits"] == res["requests"]  # Guaranteed QoS
    assert res["claims"] == [{"name": "imex"}]
    # The chart's defaults are the same figures.
    values = VALUES.read_text()
    assert f"cpu: {cpu}" in values
    assert f"memory: {memory}" in values


def test_the_requests_are_configurable() -> None:
    res = _resources(DaemonSettings(cpu="250m", memory="256Mi"))
    assert res["requests"] == res["limits"] == {"cpu": "250m", "memory": "256Mi"}


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
