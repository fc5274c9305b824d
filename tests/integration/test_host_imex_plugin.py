"""`fabricdra compute-domain-plugin` asking the host's own IMEX service over its command socket
(issue 22 point 9), against a real kube-apiserver: the flags the chart passes with
`computeDomains.hostImex.enabled` (`--host-imex-socket`, the driver root as the container sees
it) reach the check, whose answer is the host report Lease that host-mode domains read. The
service is the stand-in `nvidia-imex` with `IMEX_CMD_UNIX_DOMAIN_PATH`, the tool the stand-in
`nvidia-imex-ctl` in the driver root's `usr/bin`, where the IMEX package installs it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import LEASES, NODES, Rest

from .computedomain_helpers import create_plugin_node, unique

pytestmark = pytest.mark.integration
STAND_INS = Path(__file__).resolve().parents[1] / "imex"


def test_plugin_reports_the_host_service_it_asks_over_the_socket(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    rest = Rest(control_plane.api_client())
    report_ns = unique("cd-report")
    control_plane.create_namespace(report_ns)
    node = unique("hostsock")
    create_plugin_node(control_plane, node)
    # Unix socket paths hold 107 bytes: pytest's tmp paths are too deep for the sockets.
    short = Path(tempfile.mkdtemp(prefix="cdh-"))
    driver_root = tmp_path / "driver-root"
    (driver_root / "usr" / "bin").mkdir(parents=True)
    shutil.copy2(STAND_INS / "nvidia-imex-ctl", driver_root / "usr" / "bin" / "nvidia-imex-ctl")
    etc = short / "nvidia-imex"
    etc.mkdir()
    sock = etc / "imex_ctrl.sock"
    (etc / "nodes_config.cfg").write_text("10.0.0.1\n")
    (etc / "config.cfg").write_text(
        f"IMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH={sock}\n"
        f"IMEX_NODE_CONFIG_FILE={etc / 'nodes_config.cfg'}\n"
    )
    service = subprocess.Popen(
        [sys.executable, str(STAND_INS / "nvidia-imex"), "-c", str(etc / "config.cfg")]
    )
    plugin = _run_plugin(
        control_plane,
        node,
        report_ns,
        short,
        # As the chart passes them: the host path, and where the container sees it.
        "--driver-root",
        "/run/nvidia/driver",
        "--container-driver-root",
        str(driver_root),
        "--host-imex-socket",
        str(sock),
        "--host-imex-interval",
        "0.3",
    )

    def report() -> tuple[str, str]:
        obj = rest.get_or_none(LEASES, f"imex-host-{node}", report_ns) or {}
        annotations = obj.get("metadata", {}).get("annotations", {})
        return annotations.get(cd.REPORT_READY, ""), annotations.get(cd.REPORT_MESSAGE, "")

    try:
        wait_for(
            lambda: report()[0] == "true" or plugin.poll() is not None,
            timeout=60,
            what="a ready host report",
        )
        assert plugin.poll() is None, plugin.communicate()[1].decode()[-3000:]
        assert report() == ("true", "host IMEX service READY")
        service.send_signal(signal.SIGTERM)  # the host's service stops (its socket goes)
        service.wait(10)
        wait_for(lambda: report()[0] == "false", timeout=60, what="the report to turn not ready")
        assert f"no IMEX command socket at {sock}" in report()[1]
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
        plugin.send_signal(signal.SIGTERM)
        _, err = plugin.communicate(timeout=30)
        shutil.rmtree(short, ignore_errors=True)
        rest.delete(NODES, node)  # no ComputeDomain was made: the Node is all it left
    assert plugin.returncode == 0, err.decode()


def _run_plugin(
    control_plane: ControlPlane, node: str, report_ns: str, short: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """`fabricdra compute-domain-plugin` for `node`, its sockets and CDI folder under
    `short` (a unix socket path holds 107 bytes: pytest's tmp paths are too deep)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "compute-domain-plugin",
            "--node-name",
            node,
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--plugin-dir",
            str(short / "plugin"),
            "--registry-dir",
            str(short / "registry"),
            "--cdi-dir",
            str(short / "cdi"),
            "--report-namespace",
            report_ns,
            *extra,
        ],
        stderr=subprocess.PIPE,
    )


def _lease_requests(control_plane: ControlPlane, lease: str) -> list[str]:
    """The plugin's requests on its host report Lease, by verb (the audit log)."""
    return [
        e["verb"]
        for e in control_plane.audit_events(user_agent="fabricdra-compute-domain-plugin")
        if (e.get("objectRef") or {}).get("resource") == "leases"
        and (e.get("objectRef") or {}).get("name") == lease
    ]


@pytest.mark.parametrize("host_mode", [False, True], ids=["host-mode-off", "host-mode-on"])
def test_the_host_report_is_written_only_in_host_mode_and_when_it_changed(
    control_plane: ControlPlane, host_mode: bool
) -> None:
    """Issue 29, point 11: every node's plugin asked its host's IMEX service and wrote its
    host report every 30 s, a GET and a PATCH per node (≈ 167 of each a second at 5,000
    nodes), with host mode off too. Off (the default; the chart turns it on with
    `computeDomains.hostImex.enabled`): no request on the report at all, counted in the API
    server's audit log over the plugin's whole life. On, with the service answering READY
    every time: the report is created once and never read; later passes (at least 12,
    counted by the control tool) write nothing until the heartbeat is due (a third of 40 s;
    at most one PATCH per 13 s of the run)."""
    rest = Rest(control_plane.api_client())
    report_ns = unique("cd-quiet")
    control_plane.create_namespace(report_ns)
    node = unique("quiet")
    create_plugin_node(control_plane, node)
    short = Path(tempfile.mkdtemp(prefix="cdq-"))
    asked = short / "asked"
    ctl = short / "imex-ctl"
    ctl.write_text(f"#!/bin/sh\necho x >> {asked}\necho READY\n")
    ctl.chmod(0o755)
    lease = f"imex-host-{node}"
    extra = ("--host-imex-interval", "0.3") if host_mode else ()
    started = time.monotonic()
    plugin = _run_plugin(control_plane, node, report_ns, short, "--imex-ctl", str(ctl), *extra)
    try:
        # Serving kubelet (its registration socket): past start-up, where the report
        # loop begins.
        wait_for(
            lambda: (
                plugin.poll() is not None
                or ((short / "registry").exists() and any((short / "registry").iterdir()))
            ),
            what="the plugin serving",
        )
        assert plugin.poll() is None, plugin.communicate()[1].decode()[-3000:]
        if host_mode:
            wait_for(
                lambda: asked.exists() and len(asked.read_text().split()) >= 12,
                what="12 passes",
            )
    finally:
        plugin.send_signal(signal.SIGTERM)
        _, err = plugin.communicate(timeout=30)
        ran = time.monotonic() - started
        passes = len(asked.read_text().split()) if asked.exists() else 0
        shutil.rmtree(short, ignore_errors=True)
        rest.delete(NODES, node)
    assert plugin.returncode == 0, err.decode()
    verbs = _lease_requests(control_plane, lease)
    if not host_mode:
        assert verbs == [], f"host mode off, yet the plugin asked about its report: {verbs}"
        assert passes == 0
        return
    assert "get" not in verbs, verbs
    assert verbs.count("create") == 1, verbs
    # The first pass's patch (404, then the create), then heartbeats only: one per 40/3 s
    # of the plugin's life at most, where a write per pass would be `passes`.
    assert verbs.count("patch") <= 2 + ran / (40 / 3), (passes, ran, verbs)
    assert rest.get(LEASES, lease, report_ns)["metadata"]["annotations"][cd.REPORT_READY] == "true"
