"""Per-claim folders (device metadata, NCCL topology): removed with their claim, or at
start-up when the checkpoint no longer names the claim; never a path outside the directory."""

from __future__ import annotations

from pathlib import Path

from fabricdra.kubeletplugin import claimfolders


def test_remove_takes_the_claims_folder_and_never_one_outside(tmp_path: Path) -> None:
    base = tmp_path / "metadata"
    (base / "uid-a").mkdir(parents=True)
    (base / "uid-a" / "f.json").write_text("{}")
    (tmp_path / "outside").mkdir()
    claimfolders.remove(base, "uid-a")
    for bad in ("", ".", "..", "../outside"):
        claimfolders.remove(base, bad)
    assert not (base / "uid-a").exists()
    assert base.is_dir()
    assert (tmp_path / "outside").is_dir()


def test_keep_only_removes_other_claims_folders_and_leaves_the_rest(tmp_path: Path) -> None:
    for name in ("kept", "gone"):
        (tmp_path / name).mkdir()
    (tmp_path / "a-file").write_text("not a claim's folder")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    claimfolders.keep_only(tmp_path, ["kept", "elsewhere"], "test files")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "elsewhere", "kept", "link"]
    claimfolders.keep_only(tmp_path / "missing", [], "test files")  # no directory: nothing to do
