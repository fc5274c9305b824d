"""Finding the NVIDIA container toolkit's CDI id for one granted GPU."""

from __future__ import annotations

from pathlib import Path

import yaml

from fabricdra.kubeletplugin.nvidiacdi import ToolkitSpecs


def _spec(folder: Path, devices: list[dict[str, object]]) -> ToolkitSpecs:
    folder.mkdir(exist_ok=True)
    (folder / "nvidia.yaml").write_text(
        yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices})
    )
    return ToolkitSpecs((folder,))


def _nodes(*paths: str) -> dict[str, object]:
    return {"deviceNodes": [{"path": p} for p in paths]}


def test_the_all_device_is_never_one_gpus_id(tmp_path: Path) -> None:
    specs = _spec(
        tmp_path / "cdi",
        [
            {
                "name": "all",
                "containerEdits": _nodes("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"),
            }
        ],
    )
    # Without a device of its own, the GPU gets its device nodes injected instead.
    assert specs.gpu_id("GPU-unknown", 0) is None


def test_a_gpus_own_device_is_found_by_its_node(tmp_path: Path) -> None:
    specs = _spec(
        tmp_path / "cdi",
        [
            {"name": "all", "containerEdits": _nodes("/dev/nvidia0", "/dev/nvidia1")},
            {"name": "gpu1", "containerEdits": _nodes("/dev/nvidia1", "/dev/nvidiactl")},
        ],
    )
    assert specs.gpu_id(None, 1) == "nvidia.com/gpu=gpu1"
    assert specs.gpu_id(None, 0) is None
