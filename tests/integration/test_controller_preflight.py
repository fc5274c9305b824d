"""The ComputeDomain controller's start-up check of the API features it needs, against real
kube-apiservers: the default 1.36 one, and one with the two feature gates turned off (as on
1.34/1.35 by default), where the server would silently drop the fields the controller writes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.controlplane import ControlPlane
from e2e.harness.pytest_plugin import another_control_plane
from fabricdra.controller import preflight
from fabricdra.kube.rest import Rest

pytestmark = pytest.mark.integration

GATES_OFF = "--feature-gates=DRAConsumableCapacity=false,DRADeviceBindingConditions=false"
# The 1.36 binary serving as 1.34 (compatibility versions, KEP-4330): 1.34's API and default
# feature gates, so both gates are off as on a real 1.34 server.
EMULATED_134 = "--emulated-version=1.34"


@pytest.fixture(scope="module")
def gates_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from another_control_plane(tmp_path_factory, "gates-off", GATES_OFF)


@pytest.fixture(scope="module")
def emulated_134(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from another_control_plane(tmp_path_factory, "emulated-134", EMULATED_134)


def test_a_136_server_has_everything(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        checked = preflight.check(Rest(api))
    assert checked.ok, checked.problems
    assert checked.version.startswith("v1.36.")
    assert not checked.old
    assert "every API feature ComputeDomains need is on" in checked.message()


def test_gates_off_are_named_with_the_fields_the_server_drops(gates_off: ControlPlane) -> None:
    with gates_off.api_client() as api:
        checked = preflight.check(Rest(api))
    assert checked.problems == [
        "feature gate DRAConsumableCapacity is off: the API server drops allowMultipleAllocations",
        "feature gate DRADeviceBindingConditions is off: the API server drops bindsToNode, "
        "bindingConditions, bindingFailureConditions",
    ]
    message = checked.message()
    assert message.startswith("ComputeDomains cannot run on this cluster (Kubernetes v1.36.")
    assert "computeDomains.enabled=false" in message


def test_the_controller_exits_with_the_reason(gates_off: ControlPlane, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "controller",
            "--kubeconfig",
            str(gates_off.kubeconfig),
            "--metrics-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "feature gate DRADeviceBindingConditions is off" in done.stderr
    # It stopped before doing anything: no DeviceClass of the compute-domain driver.
    with gates_off.api_client() as api:
        classes = Rest(api).call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    assert classes == []


def test_a_server_emulating_134_is_judged_as_134(emulated_134: ControlPlane) -> None:
    """/version of a 1.36 binary run with --emulated-version=1.34 keeps gitVersion v1.36.3 and
    minor 36 (so the chart, which reads the version only, cannot tell it from 1.36), and adds
    emulationMinor 34: the check names it, judges it as 1.34 and finds both gates off."""
    with emulated_134.api_client() as api:
        rest = Rest(api)
        version = rest.call("GET", "/version")
        checked = preflight.check(rest)
    assert (version["minor"], version["emulationMinor"]) == ("36", "34")
    assert checked.version.startswith("v1.36.")
    assert checked.version.endswith(" emulating 1.34")
    assert checked.old
    assert checked.problems == [
        "feature gate DRAConsumableCapacity is off: the API server drops allowMultipleAllocations",
        "feature gate DRADeviceBindingConditions is off: the API server drops bindsToNode, "
        "bindingConditions, bindingFailureConditions",
    ]
    assert f"(Kubernetes {checked.version})" in checked.message()
