"""The chart's host IMEX mode (issue 22 point 9), rendered by the real helm (build.sh --helm):
`computeDomains.hostImex` mounts the host IMEX service's socket folder read-only into the
compute-domain container only and passes the socket on (`--host-imex-socket`), without the host
network. The plugin's side, against the stand-in service: tests/unit/test_host_imex.py."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.harness.errors import HarnessError
from e2e.harness.helm import Chart
from fabricdra.cli import build_parser

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _node_pod(chart: Chart, values: dict[str, Any] | None = None) -> dict[str, Any]:
    for doc in chart.template(values):
        if doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == "fabricdra-node":
            spec: dict[str, Any] = doc["spec"]["template"]["spec"]
            return spec
    raise AssertionError("no node DaemonSet rendered")


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name)


def test_chart_host_imex_mounts_the_socket_folder_read_only_without_host_network(
    chart: Chart,
) -> None:
    values = {"computeDomains": {"hostImex": {"enabled": True}}}
    pod = _node_pod(chart, values)
    cd = _container(pod, "compute-domain")
    assert "--host-imex-socket=/etc/nvidia-imex/imex_ctrl.sock" in cd["args"]
    assert "--host-imex-interval=30" in cd["args"]  # host mode on: the report (issue 29)
    mount = next(m for m in cd["volumeMounts"] if m["name"] == "host-imex")
    assert mount == {"name": "host-imex", "mountPath": "/etc/nvidia-imex", "readOnly": True}
    volume = next(v for v in pod["volumes"] if v["name"] == "host-imex")
    assert volume["hostPath"] == {"path": "/etc/nvidia-imex", "type": "DirectoryOrCreate"}
    assert pod["hostNetwork"] is False  # the socket needs no host network
    # Only the plugin that asks gets it.
    assert all(m["name"] != "host-imex" for m in _container(pod, "devices")["volumeMounts"])


def test_chart_host_imex_socket_path_is_a_value(chart: Chart) -> None:
    sock = "/run/nvidia-imex/ctl.sock"
    pod = _node_pod(chart, {"computeDomains": {"hostImex": {"enabled": True, "socketPath": sock}}})
    assert f"--host-imex-socket={sock}" in _container(pod, "compute-domain")["args"]
    volume = next(v for v in pod["volumes"] if v["name"] == "host-imex")
    assert volume["hostPath"]["path"] == "/run/nvidia-imex"


def test_chart_without_host_imex_mounts_nothing_of_it(chart: Chart) -> None:
    pod = _node_pod(chart)
    cd = _container(pod, "compute-domain")
    assert not [a for a in cd["args"] if a.startswith("--host-imex-socket")]
    assert all(v["name"] != "host-imex" for v in pod["volumes"])
    # Host mode off: no report (the plugin's default interval, 0), so no API request for it.
    assert not [a for a in cd["args"] if a.startswith("--host-imex-interval")]
    assert build_parser().parse_args(["compute-domain-plugin"]).host_imex_interval == 0


def test_chart_refuses_a_socket_in_the_root_folder(chart: Chart) -> None:
    """Its folder would be the host's whole root file system."""
    with pytest.raises(HarnessError, match="socketPath"):
        chart.template({"computeDomains": {"hostImex": {"enabled": True, "socketPath": "/s.sock"}}})
