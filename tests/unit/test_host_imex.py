"""Host IMEX mode installed (issue 22 point 9): the compute-domain plugin asks the host's own IMEX
service over its command unix socket with the driver root's `nvidia-imex-ctl` (hostimex.py).
The chart's side (`computeDomains.hostImex`, rendered by helm):
tests/integration/test_chart_host_imex.py. The service is the stand-in `nvidia-imex`
(tests/imex) run as a process with `IMEX_CMD_UNIX_DOMAIN_PATH`; the tool is the stand-in
`nvidia-imex-ctl` laid out in a driver root as the IMEX package installs it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.poll import wait_for
from fabricdra.cli import build_parser
from fabricdra.kubeletplugin.computedomain.driver import ComputeDomainDriver, NodeConfig
from fabricdra.kubeletplugin.computedomain.hostimex import HostImexCheck, find_tool

STAND_INS = Path(__file__).resolve().parents[1] / "imex"


def _driver_root(root: Path, folder: str = "usr/bin") -> Path:
    """A driver root whose `folder` holds the IMEX package's `nvidia-imex-ctl`."""
    (root / folder).mkdir(parents=True)
    shutil.copy2(STAND_INS / "nvidia-imex-ctl", root / folder / "nvidia-imex-ctl")
    (root / folder / "nvidia-imex-ctl").chmod(0o755)
    return root


@pytest.fixture
def host_service(tmp_path: Path) -> Iterator[Path]:
    """The host's IMEX service with its command service on a unix socket; yields the socket."""
    etc = tmp_path / "etc" / "nvidia-imex"
    etc.mkdir(parents=True)
    sock = etc / "imex_ctrl.sock"
    (etc / "nodes_config.cfg").write_text("10.0.0.1\n")
    (etc / "config.cfg").write_text(
        f"IMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH={sock}\n"
        f"IMEX_NODE_CONFIG_FILE={etc / 'nodes_config.cfg'}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(STAND_INS / "nvidia-imex"), "-c", str(etc / "config.cfg")]
    )
    try:
        wait_for(sock.exists, timeout=20, what="the host IMEX socket")
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_host_service_is_asked_over_its_socket_with_the_driver_roots_tool(
    tmp_path: Path, host_service: Path
) -> None:
    root = _driver_root(tmp_path / "driver-root")
    check = HostImexCheck(driver_root_view=root, socket=host_service)
    assert check.command() == [
        str(root / "usr" / "bin" / "nvidia-imex-ctl"),
        "-u",
        str(host_service),
        "-q",
    ]
    assert check.query(timeout=10) == (True, "host IMEX service READY")


def test_the_plugin_driver_asks_the_configured_socket(tmp_path: Path, host_service: Path) -> None:
    """What prepare and the host report use: NodeConfig's socket and the driver root view."""
    root = _driver_root(tmp_path / "driver-root")
    driver = ComputeDomainDriver(
        rest=None,  # type: ignore[arg-type]  # host_imex reads no API
        config=NodeConfig(
            node_name="n1",
            cdi_dir=tmp_path / "cdi",
            plugin_dir=tmp_path / "plugin",
            driver_root=Path("/run/nvidia/driver"),
            driver_root_view=root,
            host_imex_socket=host_service,
        ),
    )
    assert driver.host_imex(timeout=10) == (True, "host IMEX service READY")


def test_a_stopped_service_is_not_ready_and_says_why(tmp_path: Path) -> None:
    root = _driver_root(tmp_path / "driver-root")
    sock = tmp_path / "imex_ctrl.sock"
    # No socket: the service is not running or not configured for one.
    ready, message = HostImexCheck(driver_root_view=root, socket=sock).query(timeout=10)
    assert not ready
    assert f"no IMEX command socket at {sock}" in message
    assert f"IMEX_CMD_UNIX_DOMAIN_PATH={sock}" in message
    # A socket nobody serves (a service that died without removing it).
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    ready, message = HostImexCheck(driver_root_view=root, socket=sock).query(timeout=10)
    assert not ready
    assert message.startswith("host IMEX service not ready:")
    assert message.endswith("answered UNAVAILABLE")


def test_the_tool_is_looked_for_in_the_driver_root_then_on_path(tmp_path: Path) -> None:
    sbin = _driver_root(tmp_path / "sbin-root", "usr/sbin")
    assert find_tool("nvidia-imex-ctl", sbin) == str(sbin / "usr" / "sbin" / "nvidia-imex-ctl")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_tool("nvidia-imex-ctl", empty) is None
    assert find_tool("sh", empty) == shutil.which("sh")  # on PATH
    ready, message = HostImexCheck(driver_root_view=empty).query()
    assert not ready
    assert f"nvidia-imex-ctl not found in {empty} (usr/bin, usr/sbin, bin) nor on PATH" in message


def test_cli_passes_the_socket_to_the_plugin() -> None:
    args = build_parser().parse_args(
        ["compute-domain-plugin", "--host-imex-socket", "/etc/nvidia-imex/imex_ctrl.sock"]
    )
    assert args.host_imex_socket == "/etc/nvidia-imex/imex_ctrl.sock"
    assert build_parser().parse_args(["compute-domain-plugin"]).host_imex_socket is None
