"""The chart's IMEX daemon sizing (issue 11 point 4): `computeDomains.imexDaemon.resources`
reaches the controller's flags, and a value that is no Kubernetes quantity is refused."""

from __future__ import annotations

import pytest

from e2e.harness.errors import HarnessError
from e2e.harness.helm import Chart
from fabricdra.controller.objects import DaemonSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _controller_args(chart: Chart, values: dict[str, object] | None = None) -> list[str]:
    for doc in chart.template(values):
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "fabricdra-controller":
            return list(doc["spec"]["template"]["spec"]["containers"][0]["args"])
    raise AssertionError("no controller Deployment rendered")


def test_the_default_is_the_controllers_default(chart: Chart) -> None:
    args = _controller_args(chart)
    assert f"--imex-daemon-cpu={DaemonSettings().cpu}" in args
    assert f"--imex-daemon-memory={DaemonSettings().memory}" in args


def test_a_chosen_size_reaches_the_controller(chart: Chart) -> None:
    values = {"computeDomains": {"imexDaemon": {"resources": {"cpu": 1, "memory": "1Gi"}}}}
    args = _controller_args(chart, values)
    assert "--imex-daemon-cpu=1" in args
    assert "--imex-daemon-memory=1Gi" in args


def test_a_bad_size_is_refused_naming_it(chart: Chart) -> None:
    values = {"computeDomains": {"imexDaemon": {"resources": {"memory": "128 MB"}}}}
    with pytest.raises(HarnessError, match="memory"):
        chart.template(values)


def test_the_image_pull_settings_reach_the_imex_daemons(chart: Chart) -> None:
    """values.yaml says `image.pullPolicy` and `imagePullSecrets` cover the IMEX daemons too:
    the policy through the controller's flag, the secrets through the daemons' account."""
    values = {"image": {"pullPolicy": "Always"}, "imagePullSecrets": [{"name": "regcred"}]}
    assert "--image-pull-policy=Always" in _controller_args(chart, values)
    accounts = {
        d["metadata"]["name"]: d for d in chart.template(values) if d["kind"] == "ServiceAccount"
    }
    imex = accounts[DaemonSettings().service_account]
    assert imex["imagePullSecrets"] == [{"name": "regcred"}]
