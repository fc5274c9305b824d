"""e2e.harness.ociarchive on OCI archives laid out as build.sh writes them: one platform (index.json
lists the manifest) and two (index.json lists an image index that lists both manifests), with
shared objects whose ELF header names a machine, described by the real `file`."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

import pytest

from e2e.harness import ociarchive
from e2e.harness.errors import HarnessError

_EM = {"amd64": 0x3E, "arm64": 0xB7}  # ELF e_machine: EM_X86_64, EM_AARCH64
SO = "usr/local/lib/python3.11/dist-packages/grpc/_cython/cygrpc.cpython-311-{}-linux-gnu.so"


def _elf(machine: int) -> bytes:
    """The 64-byte header of a little-endian ELF64 shared object (ET_DYN) for `machine`."""
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    rest = struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0)
    return ident + rest


class _Layout:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def add(self, data: bytes) -> dict[str, object]:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        self.blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    def image(self, arch: str, so_machine: str) -> dict[str, object]:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            data = _elf(_EM[so_machine])
            info = tarfile.TarInfo(SO.format("aarch64" if arch == "arm64" else "x86_64"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        layer = self.add(gzip.compress(out.getvalue()))
        config = self.add(json.dumps({"architecture": arch, "os": "linux"}).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
        }
        return {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            **self.add(json.dumps(manifest).encode()),
        }

    def write(self, path: Path, manifests: list[dict[str, object]], nested: bool) -> Path:
        if nested:
            index = {"schemaVersion": 2, "manifests": manifests}
            index_blob = json.dumps({**index, "mediaType": ociarchive._INDEX}).encode()
            manifests = [{"mediaType": ociarchive._INDEX, **self.add(index_blob)}]
        files = {"index.json": json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()}
        files.update({f"blobs/sha256/{d.split(':')[1]}": b for d, b in self.blobs.items()})
        with tarfile.open(path, "w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(f"./{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path


def test_both_platforms_listed_through_the_nested_index(tmp_path: Path) -> None:
    layout = _Layout()
    archive = layout.write(
        tmp_path / "a.tar", [layout.image("amd64", "amd64"), layout.image("arm64", "arm64")], True
    )
    assert [i.platform for i in ociarchive.platforms(archive)] == ["linux/amd64", "linux/arm64"]
    arm = ociarchive.for_platform(archive, "linux/arm64")
    described = ociarchive.native_extensions(archive, arm)
    assert list(described) == [SO.format("aarch64")]
    assert "ARM aarch64" in described[SO.format("aarch64")]
    assert ociarchive.wrong_machine(arm, described) == {}
    assert ociarchive.main([str(archive), "--expect", "linux/amd64,linux/arm64"]) == 0


def test_an_x86_extension_in_the_arm64_image_is_reported(tmp_path: Path) -> None:
    # what installing the host's wheels into the arm64 root file system would give
    layout = _Layout()
    archive = layout.write(
        tmp_path / "a.tar", [layout.image("amd64", "amd64"), layout.image("arm64", "amd64")], True
    )
    arm = ociarchive.for_platform(archive, "linux/arm64")
    wrong = ociarchive.wrong_machine(arm, ociarchive.native_extensions(archive, arm))
    assert list(wrong) == [SO.format("aarch64")]
    assert "x86-64" in wrong[SO.format("aarch64")]
    assert ociarchive.main([str(archive)]) == 1


def test_single_platform_archive_and_a_missing_platform(tmp_path: Path) -> None:
    layout = _Layout()
    archive = layout.write(tmp_path / "a.tar", [layout.image("amd64", "amd64")], False)
    assert ociarchive.for_platform(archive, "linux/amd64").platform == "linux/amd64"
    with pytest.raises(HarnessError, match="no linux/arm64 image"):
        ociarchive.for_platform(archive, "linux/arm64")
    assert ociarchive.main([str(archive), "--expect", "linux/amd64,linux/arm64"]) == 1


def test_host_platform_is_one_build_sh_builds() -> None:
    assert ociarchive.host_platform() in {"linux/amd64", "linux/arm64"}


@pytest.mark.parametrize("nested", [False, True])
def test_with_env_names_a_copy_whose_config_adds_the_environment(
    tmp_path: Path, nested: bool
) -> None:
    arch = ociarchive.host_platform().split("/")[1]
    layout = _Layout()
    archive = layout.write(tmp_path / "a.tar", [layout.image(arch, arch)], nested)
    out = ociarchive.with_env(
        archive, tmp_path / "b.tar", "localhost/verify:weak", {"STANDIN_D2D_WEAK": "1:6:41.20"}
    )
    (image,) = ociarchive.platforms(out)
    assert image.platform == ociarchive.host_platform()
    assert image.layers == ociarchive.for_platform(archive, image.platform).layers  # same layers
    with tarfile.open(out) as tar:
        index = json.loads(ociarchive._read(tar, "index.json"))
        manifest = json.loads(ociarchive._blob(tar, image.digest))
        config = json.loads(ociarchive._blob(tar, manifest["config"]["digest"]))
    # containerd's importer names the image from this annotation.
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == (
        "localhost/verify:weak"
    )
    assert config["config"]["Env"] == ["STANDIN_D2D_WEAK=1:6:41.20"]
