"""Reading an OCI image archive (deployments/container/build.sh's): which platforms its index
lists, the manifest for one platform (the host's, for the harness), and what machine the native
extensions in each platform's layers are built for (`file` on every .so).

    python -m e2e.harness.ociarchive ARCHIVE [--expect linux/amd64,linux/arm64]

prints one line per platform and per native extension; exit 1 when an expected platform is
missing or an extension is not code for its image's machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.harness.errors import HarnessError

_INDEX = "application/vnd.oci.image.index.v1+json"
# What `file` names each architecture's ELF machine.
FILE_MACHINE = {"amd64": "x86-64", "arm64": "ARM aarch64"}
_UNAME = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def host_platform() -> str:
    """The OCI platform of this machine, e.g. linux/amd64."""
    machine = platform.machine()
    if machine not in _UNAME:
        raise HarnessError(f"no image is built for this machine ({machine})")
    return f"linux/{_UNAME[machine]}"


@dataclass(frozen=True)
class PlatformImage:
    platform: str  # os/architecture
    digest: str  # the manifest's
    layers: tuple[str, ...]  # layer blob digests, lowest first


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    # tar -C DIR . writes "./index.json"; other tools write "index.json"
    for candidate in (f"./{name}", name):
        try:
            member = tar.getmember(candidate)
        except KeyError:
            continue
        data = tar.extractfile(member)
        if data is not None:
            return data.read()
    raise HarnessError(f"{name} is not in the archive")


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    algo, hexd = digest.split(":", 1)
    return _read(tar, f"blobs/{algo}/{hexd}")


def _index(tar: tarfile.TarFile) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(_read(tar, "index.json"))
    return loaded


def platforms(archive: Path) -> list[PlatformImage]:
    """Every image in the archive, following a nested image index (a multi-platform build)."""
    found: list[PlatformImage] = []
    with tarfile.open(archive) as tar:
        pending = list(_index(tar)["manifests"])
        while pending:
            desc = pending.pop(0)
            body = json.loads(_blob(tar, desc["digest"]))
            if desc.get("mediaType") == _INDEX or body.get("mediaType") == _INDEX:
                pending.extend(body["manifests"])
                continue
            config = json.loads(_blob(tar, body["config"]["digest"]))
            found.append(
                PlatformImage(
                    platform=f"{config['os']}/{config['architecture']}",
                    digest=desc["digest"],
                    layers=tuple(layer["digest"] for layer in body["layers"]),
                )
            )
    return found


def for_platform(archive: Path, wanted: str) -> PlatformImage:
    """The image of one platform (e.g. host_platform()) from the archive's index."""
    images = platforms(archive)
    for image in images:
        if image.platform == wanted:
            return image
    listed = ", ".join(i.platform for i in images) or "none"
    raise HarnessError(f"{archive} has no {wanted} image (it has: {listed})")


def with_env(archive: Path, out: Path, ref: str, env: dict[str, str]) -> Path:
    """A copy of the archive's host-platform image named `ref` whose config adds `env` (the
    same layers): how a test hands the stand-in tools in an image their knobs (STANDIN_*)
    where the product sets no environment of its own, e.g. the fabric check's launcher."""
    import hashlib
    import io

    image = for_platform(archive, host_platform())
    with tarfile.open(archive) as tar:
        manifest = json.loads(_blob(tar, image.digest))
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        run = config.setdefault("config", {})
        run["Env"] = [*(run.get("Env") or []), *(f"{k}={v}" for k, v in env.items())]
        blobs: dict[str, bytes] = {}

        def add(data: bytes) -> dict[str, Any]:
            digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
            blobs[digest] = data
            return {"digest": digest, "size": len(data)}

        manifest["config"] = {**manifest["config"], **add(json.dumps(config).encode())}
        os_, _, arch = image.platform.partition("/")
        desc = {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            **add(json.dumps(manifest).encode()),
            "platform": {"os": os_, "architecture": arch},
            "annotations": {
                "io.containerd.image.name": ref,
                "org.opencontainers.image.ref.name": ref.rpartition(":")[2],
            },
        }
        index = {"schemaVersion": 2, "mediaType": _INDEX, "manifests": [desc]}
        with tarfile.open(out, "w") as copy:
            for member in tar.getmembers():
                if member.name.lstrip("./") == "index.json":
                    continue
                copy.addfile(member, tar.extractfile(member) if member.isfile() else None)
            extra = {f"blobs/sha256/{d.split(':')[1]}": b for d, b in blobs.items()}
            extra["index.json"] = json.dumps(index).encode()
            for name, data in extra.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                copy.addfile(info, io.BytesIO(data))
    return out


def native_extensions(archive: Path, image: PlatformImage) -> dict[str, str]:
    """`file`'s description of every shared object (.so) in the image's layers, by path."""
    described: dict[str, str] = {}
    with tarfile.open(archive) as tar, tempfile.TemporaryDirectory() as tmp:
        for n, digest in enumerate(image.layers):
            layer_path = Path(tmp) / f"layer{n}"
            layer_path.write_bytes(_blob(tar, digest))
            with tarfile.open(layer_path, "r:*") as layer:
                for member in layer:
                    if not (member.isfile() and ".so" in Path(member.name).name):
                        continue
                    data = layer.extractfile(member)
                    assert data is not None
                    sample = Path(tmp) / "sample"
                    sample.write_bytes(data.read())
                    out = subprocess.run(
                        ["file", "-b", str(sample)], capture_output=True, text=True, check=True
                    )
                    described[member.name.lstrip("./")] = out.stdout.strip()
            layer_path.unlink()
    return described


def wrong_machine(image: PlatformImage, described: dict[str, str]) -> dict[str, str]:
    """The ELF objects among `described` that are not code for the image's architecture."""
    machine = FILE_MACHINE[image.platform.split("/")[1]]
    return {
        path: what
        for path, what in described.items()
        if what.startswith("ELF") and f", {machine}," not in what
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.ociarchive")
    parser.add_argument("archive", type=Path)
    parser.add_argument("--expect", default="", help="platforms that must be listed (comma list)")
    parser.add_argument("--under", default="usr/local/lib/python3.11/dist-packages/")
    args = parser.parse_args(argv)
    images = platforms(args.archive)
    ok = True
    for wanted in filter(None, args.expect.split(",")):
        if wanted not in {i.platform for i in images}:
            print(f"MISSING {wanted}")
            ok = False
    for image in images:
        print(f"{image.platform} {image.digest}")
        described = {
            p: w
            for p, w in native_extensions(args.archive, image).items()
            if p.startswith(args.under)
        }
        wrong = wrong_machine(image, described)
        for path, what in sorted(described.items()):
            mark = "WRONG" if path in wrong else "ok"
            print(f"  {mark} {path}: {what.split(', BuildID')[0]}")
        print(f"  {len(described)} native extensions, {len(wrong)} not {image.platform} code")
        ok = ok and not wrong and bool(described)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
