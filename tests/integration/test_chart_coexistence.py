"""Never hand out a device twice (issue 30 point 1), the chart's half: with the defaults it
refuses to install until the installer says no device plugin hands out the same devices
(`devicePlugins.absent`, as NVIDIA's GPU DRA chart asks `gpuResourcesEnabledOverride`), and
it hands the operator's extra device plugin resource names to every node agent."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.harness.helm import Chart

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bare() -> Chart:
    return Chart(base_values={})  # exactly what `helm install` with no values renders


def _devices(docs: list[dict[str, Any]]) -> dict[str, Any]:
    ds = next(
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "fabricdra-node"
    )
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "devices")


def test_the_default_install_is_refused_with_the_reason_and_the_way_out(bare: Chart) -> None:
    out = bare.render(check=False)
    assert "devicePlugins.absent must be set to true" in out
    assert "handed out twice" in out
    assert "devicePlugin.enabled=false" in out  # the GPU Operator's switch
    assert "--set devicePlugins.absent=true" in out
    assert "docs/coexistence.md" in out


@pytest.mark.parametrize(
    "values",
    [
        {"devicePlugins": {"absent": True}},
        # beside a device plugin for everything: ours offer nothing, so nothing to assert
        {"gpus": {"enabled": False}, "rdma": {"enabled": False}},
    ],
)
def test_it_installs_once_said_or_with_nothing_offered(bare: Chart, values: dict[str, Any]) -> None:
    assert bare.template(values)


def test_rdma_alone_still_asks(bare: Chart) -> None:
    # Beside NVIDIA's GPU DRA driver fabricdra offers the NICs: the RDMA plugins may be there.
    out = bare.render({"gpus": {"enabled": False}}, check=False)
    assert "devicePlugins.absent must be set to true" in out


def test_extra_device_plugin_resources_reach_the_agent(bare: Chart) -> None:
    values = {"devicePlugins": {"absent": True, "resources": ["rdma=nvidia.com/sriov_rdma_vf"]}}
    args = _devices(bare.template(values))["args"]
    assert "--device-plugin-resource=rdma=nvidia.com/sriov_rdma_vf" in args
    assert not [a for a in _devices(bare.template({"devicePlugins": {"absent": True}}))["args"]
                if a.startswith("--device-plugin-resource")]  # fmt: skip


@pytest.mark.parametrize("bad", ["gpu=nvidia.com/gpu", "rdma=sriov", "rdma"])
def test_the_schema_refuses_a_bad_resource(bare: Chart, bad: str) -> None:
    out = bare.render({"devicePlugins": {"absent": True, "resources": [bad]}}, check=False)
    assert "devicePlugins" in out
    assert "resources" in out
    assert "Error" in out or "error" in out
