"""The node side without an API server: /proc/devices, channel device nodes, IMEX supervision
with the stand-in executables in tests/imex."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.poll import wait_for
from fabricdra.kubeletplugin.computedomain.channels import (
    ChannelError,
    ChannelNode,
    ensure_host_node,
    imex_major,
)
from fabricdra.kubeletplugin.computedomain.daemon import peers_of
from fabricdra.kubeletplugin.computedomain.imex import ImexSettings, ImexSupervisor
from tests.imex import NVRM_OPEN, NVRM_PROPRIETARY, driver_tree

STAND_INS = Path(__file__).resolve().parents[1] / "imex"
PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
234 nvidia-caps-imex-channels
511 nvidia-caps

Block devices:
  8 sd
"""


def test_major_is_read_from_the_character_section(tmp_path: Path) -> None:
    (tmp_path / "devices").write_text(PROC_DEVICES)
    assert imex_major(tmp_path) == 234
    (tmp_path / "devices").write_text("Character devices:\n195 nvidia\n")
    assert imex_major(tmp_path) is None
    with pytest.raises(ChannelError, match="does not exist"):
        imex_major(tmp_path / "nope")


def test_channel_node_is_created_once_and_checked(tmp_path: Path) -> None:
    path = ensure_host_node(tmp_path, ChannelNode(5, 234))
    st = path.lstat()
    assert path == tmp_path / "nvidia-caps-imex-channels" / "channel5"
    assert stat.S_ISCHR(st.st_mode)
    assert st.st_rdev == os.makedev(234, 5)
    assert ensure_host_node(tmp_path, ChannelNode(5, 234)) == path  # idempotent
    with pytest.raises(ChannelError, match="not the character device"):
        ensure_host_node(tmp_path, ChannelNode(5, 235))


def test_peers_are_this_fabric_domain_by_index() -> None:
    domain = {
        "status": {
            "nodes": [
                {"name": "b", "index": 1, "ipAddress": "10.0.0.2", "fabricDomain": "r1"},
                {"name": "a", "index": 0, "ipAddress": "10.0.0.1", "fabricDomain": "r1"},
                {"name": "x", "index": 2, "ipAddress": "10.9.9.9", "fabricDomain": "r2"},
            ]
        }
    }
    assert peers_of(domain, "b") == {0: "10.0.0.1", 1: "10.0.0.2"}
    assert peers_of(domain, "unknown") == {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[ImexSupervisor]:
    sup = ImexSupervisor(
        ImexSettings(
            config_dir=tmp_path / "imexd",
            imex_bin=str(STAND_INS / "nvidia-imex"),
            imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
            cmd_port=_free_port(),
            restart_backoff=(0.05,),
        )
    )
    yield sup
    sup.stop()


def _until_ready(sup: ImexSupervisor, peers: list[str] | dict[int, str]) -> str:
    def ready() -> str | None:
        state = sup.step(peers)
        return state.message if state.ready else None

    return str(wait_for(ready, what="IMEX ready", interval=0.1))


def test_writes_config_starts_imex_and_reports_ready(supervisor: ImexSupervisor) -> None:
    _until_ready(supervisor, ["10.0.0.1", "10.0.0.2"])
    # Stable names, one per slot; the names resolve through our block of the hosts file.
    names = supervisor.nodes_path.read_text().splitlines()
    assert names == [f"fabricdra-imex-{i}" for i in range(18)]
    hosts = supervisor.hosts_path.read_text()
    assert "10.0.0.1\tfabricdra-imex-0\n10.0.0.2\tfabricdra-imex-1\n" in hosts
    cfg = supervisor.config_path.read_text()
    assert f"IMEX_NODE_CONFIG_FILE={supervisor.nodes_path}" in cfg
    assert "IMEX_CMD_ENABLED=1" in cfg


def _fake_state(path: Path) -> dict[str, object]:
    import json

    doc: dict[str, object] = json.loads(path.read_text())
    return doc


def test_a_join_reloads_imex_in_place(
    supervisor: ImexSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer joining or changing its IP is a SIGUSR1 (re-resolve), never a restart: the
    process, and the memory peers imported through it, stay."""
    state_file = tmp_path / "fake-imex.json"
    monkeypatch.setenv("FAKE_IMEX_STATE_FILE", str(state_file))
    _until_ready(supervisor, {0: "10.0.0.1"})
    first = supervisor.pid()
    assert _fake_state(state_file)["reloads"] == 0
    _until_ready(supervisor, {0: "10.0.0.1", 2: "10.0.0.3"})
    assert supervisor.pid() == first
    assert supervisor.reloads == 1
    wait_for(
        lambda: _fake_state(state_file)["reloads"] == 1,
        what="the fake IMEX to see the reload",
        interval=0.05,
    )
    seen = _fake_state(state_file)
    assert seen["pid"] == first
    assert seen["peers"]["fabricdra-imex-2"] == "10.0.0.3"  # type: ignore[index]
    assert seen["peers"]["fabricdra-imex-1"] is None  # type: ignore[index]
    # Nothing changed: nothing is sent.
    _until_ready(supervisor, {0: "10.0.0.1", 2: "10.0.0.3"})
    assert supervisor.reloads == 1


def test_a_node_missing_from_status_for_a_moment_keeps_imex(supervisor: ImexSupervisor) -> None:
    _until_ready(supervisor, ["10.0.0.1", "10.0.0.2"])
    first = supervisor.pid()
    state = supervisor.step([])
    assert not state.ready
    assert "keeps running" in state.message
    assert supervisor.pid() == first
    _until_ready(supervisor, ["10.0.0.1", "10.0.0.2"])
    assert supervisor.pid() == first


def test_imex_failure_is_reported_with_its_message(
    supervisor: ImexSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_IMEX_EXIT_AFTER", "0.2")

    def exited() -> object:
        state = supervisor.step(["10.0.0.1"])
        return state if "exited" in state.message else None

    state: Any = wait_for(exited, what="IMEX's exit reported", interval=0.1)
    assert not state.ready
    assert "exited with status 3" in state.message
    assert "lost connection" in state.message


def test_a_hung_imex_is_killed_and_restarted(supervisor: ImexSupervisor) -> None:
    """Issue 29, point 11: a hung nvidia-imex (alive, answering nothing) was never restarted
    (only an exit was). Stopped with SIGSTOP it answers no query; after `hang_seconds` the
    supervisor kills it, says why, and a new IMEX becomes READY."""
    supervisor.settings.hang_seconds = 1.0
    _until_ready(supervisor, ["10.0.0.1"])
    hung = supervisor.pid()
    assert hung is not None
    os.kill(hung, signal.SIGSTOP)
    said: list[str] = []

    def restarted() -> bool:
        state = supervisor.step(["10.0.0.1"])
        said.append(state.message)
        return state.ready and supervisor.pid() not in (None, hung)

    try:
        wait_for(restarted, what="the hung IMEX replaced by a ready one", interval=0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # left stopped only if the test failed
            os.kill(hung, signal.SIGCONT)
    assert any("answered no query for 1s while running (hung); killed" in m for m in said), said
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left beside the new one
        os.kill(hung, 0)


def test_missing_binary_is_a_clear_state_not_a_crash(tmp_path: Path) -> None:
    sup = ImexSupervisor(ImexSettings(config_dir=tmp_path, imex_bin="/opt/none/nvidia-imex"))
    state = sup.step(["10.0.0.1"])
    assert not state.ready
    assert "not found" in state.message
    assert "no IMEX binary" in state.message
    assert "not found" in sup.step([]).message  # said before anything else


def test_no_peers_yet_is_waiting(supervisor: ImexSupervisor) -> None:
    state = supervisor.step([])
    assert not state.ready
    assert state.message.startswith("waiting")


def test_cli_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from fabricdra.cli import main

    assert main(["controller", "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fabricdra controller: --workers must be at least 1, got 0"
    )
    assert main(["imex-daemon", "--domain-name", "x", "--node-name", "n"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fabricdra imex-daemon: missing --domain-namespace, --domain-uid")


def test_imex_daemon_check_is_the_readiness_probe(
    supervisor: ImexSupervisor, capsys: pytest.CaptureFixture[str]
) -> None:
    from fabricdra.cli import main

    probe = [
        "imex-daemon",
        "--check",
        "--config-dir",
        str(supervisor.settings.config_dir),
        "--imex-ctl",
        str(STAND_INS / "nvidia-imex-ctl"),
    ]
    supervisor.settings.config_dir.mkdir(parents=True, exist_ok=True)
    supervisor.config_path.write_text(f"IMEX_CMD_PORT={supervisor.settings.cmd_port}\n")
    assert main(probe) == 1
    assert capsys.readouterr().out.strip() == "IMEX not ready: UNAVAILABLE"
    _until_ready(supervisor, ["10.0.0.1"])
    assert main(probe) == 0
    assert capsys.readouterr().out.strip() == "READY"


def test_imex_daemon_gets_the_drivers_imex_and_the_fabric_capability(tmp_path: Path) -> None:
    """Point 1: the host driver's nvidia-imex / nvidia-imex-ctl (read-only) and the
    fabric-imex-mgmt capability device, laid out as the driver lays them out."""
    from fabricdra.kubeletplugin.computedomain.imexfiles import imex_injection

    root = tmp_path / "run-nvidia-driver"  # as the GPU operator mounts it
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("nvidia-imex", "nvidia-imex-ctl"):
        (root / "usr" / "bin" / name).write_text("#!/bin/sh\n")
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia" / "capabilities").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "capabilities" / "fabric-imex-mgmt").write_text(
        "DeviceFileMinor: 7\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    )
    (proc / "devices").write_text(
        "Character devices:\n195 nvidia\n237 nvidia-caps-imex-channels\n238 nvidia-caps\n\n"
        "Block devices:\n238 not-this-one\n"
    )
    got = imex_injection(Path("/run/nvidia/driver"), root, proc)
    # (No /dev/nvidiactl, driver version or libraries in this tree: the next test has them.)
    assert not [m for m in got.missing if "nvidia-imex" in m or "fabric-imex-mgmt" in m]
    assert [(m.host_path, m.container_path) for m in got.mounts] == [
        ("/run/nvidia/driver/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex"),
        ("/run/nvidia/driver/usr/bin/nvidia-imex-ctl", "/usr/bin/nvidia-imex-ctl"),
    ]
    assert all("ro" in m.options for m in got.mounts)
    (node,) = [n for n in got.device_nodes if n.path.startswith("/dev/nvidia-caps/")]
    assert (node.path, node.major, node.minor) == ("/dev/nvidia-caps/nvidia-cap7", 238, 7)

    # A driver without IMEX: nothing made up, and what is missing is named.
    bare = imex_injection(Path("/"), tmp_path / "empty", tmp_path / "noproc")
    assert bare.mounts == ()
    assert bare.device_nodes == ()
    assert any("nvidia-imex" in m for m in bare.missing)
    assert any("fabric-imex-mgmt" in m for m in bare.missing)


# -- what the real nvidia-imex needs (issue 22 point 8) ----------------------------------------


def test_driver_version_is_the_loaded_modules(tmp_path: Path) -> None:
    from fabricdra.kubeletplugin.computedomain.imexfiles import driver_version, older_than

    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "version").write_text(NVRM_OPEN)
    assert driver_version(tmp_path) == "570.158.01"
    (tmp_path / "driver" / "nvidia" / "version").write_text(NVRM_PROPRIETARY)
    assert driver_version(tmp_path) == "565.57.01"
    assert driver_version(tmp_path / "none") is None
    # Numbers, not strings: 570.86.16 is older than 570.158.01, 580.65.06 newer.
    assert older_than("570.86.16")
    assert older_than("565.57.01")
    assert not older_than("570.158.01")
    assert not older_than("580.65.06")


def test_imex_daemon_gets_the_control_device_and_the_driver_libraries(tmp_path: Path) -> None:
    """Point 8: besides the two executables and the capability, what NVIDIA's daemon gets:
    /dev/nvidiactl and the loaded driver's libraries (soname links included, nothing of
    another driver version), and the driver version for the daemon's guard."""
    from fabricdra.kubeletplugin.computedomain.imexfiles import IMEX_LIBRARY_DIR, imex_injection

    root, proc, dev = driver_tree(tmp_path)
    got = imex_injection(Path("/run/nvidia/driver"), root, proc, dev)
    assert got.missing == ()
    assert got.driver_version == "570.158.01"
    assert got.library_dir == IMEX_LIBRARY_DIR
    ctl = next(n for n in got.device_nodes if n.path == "/dev/nvidiactl")
    assert (ctl.major, ctl.minor, ctl.host_path) == (195, 255, str(dev / "nvidiactl"))
    host = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    libs = {m.container_path: m.host_path for m in got.mounts if "/lib" in m.container_path}
    assert libs == {
        f"{IMEX_LIBRARY_DIR}/{link}": f"{host}/{target}"
        for name in ("libnvidia-ml", "libcuda", "libnvidia-nvvm")
        for link, target in (
            (f"{name}.so.570.158.01", f"{name}.so.570.158.01"),
            (f"{name}.so.1", f"{name}.so.570.158.01"),
        )
    }
    assert all("ro" in m.options for m in got.mounts)

    bare = imex_injection(Path("/"), tmp_path / "empty", tmp_path / "noproc", tmp_path / "nodev")
    assert bare.driver_version is None
    assert bare.library_dir is None
    assert any("nvidiactl" in m for m in bare.missing)
    assert any("driver/nvidia/version" in m for m in bare.missing)


def test_imex_command_port_listens_on_the_node_address_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point 8: IMEX_CMD_BIND_INTERFACE_IP is the node's address; left out, nvidia-imex binds
    its command service to every interface of the host network."""
    state_file = tmp_path / "fake-imex.json"
    monkeypatch.setenv("FAKE_IMEX_STATE_FILE", str(state_file))
    port = _free_port()
    sup = ImexSupervisor(
        ImexSettings(
            config_dir=tmp_path / "imexd",
            imex_bin=str(STAND_INS / "nvidia-imex"),
            imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
            bind_ip="127.0.0.2",  # stands for the node's fabric address
            cmd_port=port,
        )
    )
    try:
        _until_ready(sup, ["127.0.0.2"])
        assert "IMEX_CMD_BIND_INTERFACE_IP=127.0.0.2\n" in sup.config_path.read_text()
        assert _fake_state(state_file)["cmd_bind"] == "127.0.0.2"
        with socket.create_connection(("127.0.0.2", port), timeout=2):
            pass
        with pytest.raises(ConnectionRefusedError):  # not on the other addresses
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        sup.stop()
    # No address known (no pod IP): loopback, never the empty "every interface".
    unknown = ImexSettings(config_dir=tmp_path / "other")
    from fabricdra.kubeletplugin.computedomain.imex import render_config

    assert "IMEX_CMD_BIND_INTERFACE_IP=127.0.0.1\n" in render_config(unknown)


def test_imex_is_not_started_on_a_driver_older_than_570_158_01(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point 8: below 570.158.01 NVIDIA does not support IMEX with named peers re-resolved on
    SIGUSR1, which every join relies on: IMEX is not started and the state says why."""
    state_file = tmp_path / "fake-imex.json"
    monkeypatch.setenv("FAKE_IMEX_STATE_FILE", str(state_file))

    def supervisor(version: str) -> ImexSupervisor:
        return ImexSupervisor(
            ImexSettings(
                config_dir=tmp_path / "imexd",
                imex_bin=str(STAND_INS / "nvidia-imex"),
                imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
                cmd_port=_free_port(),
                driver_version=version,
            )
        )

    old = supervisor("570.86.16")
    state = old.step(["10.0.0.1"])
    assert not state.ready
    assert "570.86.16" in state.message
    assert "570.158.01" in state.message
    assert old.pid() is None
    assert not state_file.exists()
    assert "570.158.01" in old.step([]).message  # said before anything else
    new = supervisor("570.158.01")
    try:
        _until_ready(new, ["10.0.0.1"])
    finally:
        new.stop()


def test_imex_gets_the_driver_libraries_on_its_library_path(
    supervisor: ImexSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder the plugin mounted the driver's libraries in is IMEX's LD_LIBRARY_PATH,
    and only IMEX's (this Python process keeps its own)."""
    state_file = tmp_path / "fake-imex.json"
    monkeypatch.setenv("FAKE_IMEX_STATE_FILE", str(state_file))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/image/lib")
    supervisor.settings.library_path = "/usr/lib/fabricdra-driver"
    _until_ready(supervisor, ["10.0.0.1"])
    seen = _fake_state(state_file)["ld_library_path"]
    assert seen == "/usr/lib/fabricdra-driver:/opt/image/lib"
    assert os.environ["LD_LIBRARY_PATH"] == "/opt/image/lib"
