"""An offline node agent's configuration for unit tests: every folder under one temporary
folder, a fixed boot id, no verification gate (these tests are about the pass, not the gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.agent import AgentConfig


def offline_config(tmp_path: Path, sysfs_root: Path, **kw: Any) -> AgentConfig:
    (tmp_path / "boot_id").write_text("boot-1\n")
    kw.setdefault("node_name", "n1")
    kw.setdefault("verification_gate", False)
    return AgentConfig(
        sysfs_root=sysfs_root,
        cdi_dir=tmp_path / "cdi",
        toolkit_cdi_dirs=(),
        plugin_dir=tmp_path / "plugin",
        registry_dir=tmp_path / "registry",
        state_dir=tmp_path / "state",
        boot_id_file=tmp_path / "boot_id",
        **kw,
    )
