"""The chart refuses ComputeDomains below Kubernetes 1.36 (their API features are off by
default there), rendered by the real helm for each supported version."""

from __future__ import annotations

import pytest

from e2e.harness.helm import Chart

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


@pytest.mark.parametrize("version", ["1.34.0", "1.35.4"])
def test_compute_domains_below_136_fail_with_the_reason(chart: Chart, version: str) -> None:
    out = chart.render(kube_version=version, check=False)
    assert "computeDomains.enabled=true needs Kubernetes 1.36 or later" in out
    assert f"this cluster is v{version}" in out
    assert "--set computeDomains.enabled=false" in out


@pytest.mark.parametrize("version", ["1.34.0", "1.35.4"])
def test_devices_alone_install_on_134_and_135(chart: Chart, version: str) -> None:
    docs = chart.template({"computeDomains": {"enabled": False}}, kube_version=version)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("DaemonSet", "fabricdra-node") in kinds
    assert ("Deployment", "fabricdra-controller") not in kinds


@pytest.mark.parametrize("version", ["1.36.0", "1.36.3", "1.37.0-alpha.1"])
def test_compute_domains_install_from_136(chart: Chart, version: str) -> None:
    docs = chart.template(kube_version=version)
    assert any(
        d["kind"] == "Deployment" and d["metadata"]["name"] == "fabricdra-controller" for d in docs
    )
