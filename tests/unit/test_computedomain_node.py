"""The node side without an API server: /proc/devices, channel device nodes, IMEX supervision
with the stand-in executables in tests/imex."""

from __future__ import annotations

import os
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
    assert got.missing == ()
    assert [(m.host_path, m.container_path) for m in got.mounts] == [
        ("/run/nvidia/driver/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex"),
        ("/run/nvidia/driver/usr/bin/nvidia-imex-ctl", "/usr/bin/nvidia-imex-ctl"),
    ]
    assert all("ro" in m.options for m in got.mounts)
    (node,) = got.device_nodes
    assert (node.path, node.major, node.minor) == ("/dev/nvidia-caps/nvidia-cap7", 238, 7)

    # A driver without IMEX: nothing made up, and what is missing is named.
    bare = imex_injection(Path("/"), tmp_path / "empty", tmp_path / "noproc")
    assert bare.mounts == ()
    assert bare.device_nodes == ()
    assert any("nvidia-imex" in m for m in bare.missing)
    assert any("fabric-imex-mgmt" in m for m in bare.missing)
