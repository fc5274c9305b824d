"""Finding the NVIDIA container toolkit's CDI id for one granted GPU."""

from __future__ import annotations

from pathlib import Path

import yaml

from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs


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


def test_a_mig_instance_never_resolves_to_the_all_device(tmp_path: Path) -> None:
    # nvidia-ctk with the type-index naming strategy: `all` (every GPU, every capability)
    # sorts before the instance's own device and holds a superset of its nodes.
    caps = ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
    every = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", *caps]
    every += ["/dev/nvidia-caps/nvidia-cap31", "/dev/nvidia-caps/nvidia-cap32"]
    specs = _spec(
        tmp_path / "cdi",
        [
            {"name": "all", "containerEdits": _nodes(*every)},
            {"name": "mig-1:0", "containerEdits": _nodes("/dev/nvidia1", "/dev/nvidiactl", *caps)},
        ],
    )
    assert specs.mig_id(None, 1, caps) == "nvidia.com/gpu=mig-1:0"


def test_a_mig_instance_without_its_own_device_gets_no_toolkit_id(tmp_path: Path) -> None:
    caps = ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
    specs = _spec(
        tmp_path / "cdi",
        [
            {"name": "all", "containerEdits": _nodes("/dev/nvidia0", "/dev/nvidia1", *caps)},
            # another GPU's node with the same caps (a stale spec): not this instance
            {"name": "mig-0:0", "containerEdits": _nodes("/dev/nvidia0", *caps)},
            # the instance plus a second one's caps: more than it was granted
            {
                "name": "two",
                "containerEdits": _nodes("/dev/nvidia1", *caps, "/dev/nvidia-caps/nvidia-cap9"),
            },
        ],
    )
    assert specs.mig_id(None, 1, caps) is None


def test_the_all_device_is_never_used_even_with_exactly_the_grants_nodes(tmp_path: Path) -> None:
    # One GPU with one MIG instance: `all` holds exactly the instance's nodes, and the same
    # GPU without MIG: exactly the GPU's node.
    caps = ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    specs = _spec(
        tmp_path / "mig", [{"name": "all", "containerEdits": _nodes("/dev/nvidia0", *caps)}]
    )
    assert specs.mig_id(None, 0, caps) is None
    specs = _spec(tmp_path / "gpu", [{"name": "all", "containerEdits": _nodes("/dev/nvidia0")}])
    assert specs.gpu_id(None, 0) is None


def test_a_device_found_by_uuid_must_hold_exactly_the_grants_nodes(tmp_path: Path) -> None:
    caps = ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    specs = _spec(
        tmp_path / "cdi",
        [
            {"name": "GPU-a", "containerEdits": _nodes("/dev/nvidia0", "/dev/nvidia1")},
            {"name": "GPU-b", "containerEdits": _nodes("/dev/nvidia1")},
            {"name": "MIG-a", "containerEdits": _nodes("/dev/nvidia0", caps[0])},
            {"name": "MIG-b", "containerEdits": _nodes("/dev/nvidia0", *caps)},
        ],
    )
    assert specs.gpu_id("GPU-a", 0) is None
    assert specs.gpu_id("GPU-b", 1) == "nvidia.com/gpu=GPU-b"
    assert specs.gpu_id("GPU-b", None) is None  # nothing to check it against
    assert specs.mig_id("MIG-a", 0, caps) is None
    assert specs.mig_id("MIG-b", 0, caps) == "nvidia.com/gpu=MIG-b"
    assert specs.mig_id("MIG-b") is None


def test_lookups_within_a_pinned_block_share_one_look_at_the_folders(tmp_path: Path) -> None:
    specs = _spec(tmp_path / "cdi", [{"name": "0", "containerEdits": _nodes("/dev/nvidia0")}])
    with specs.pinned():
        assert specs.gpu_id(None, 0) == "nvidia.com/gpu=0"
        (tmp_path / "cdi" / "nvidia.yaml").unlink()
        assert specs.gpu_id(None, 0) == "nvidia.com/gpu=0"
    assert specs.gpu_id(None, 0) is None  # the next prepare looks again
