"""Container images built on this machine, with no registry and no Docker.

Each image is one layer, written as a docker-archive tarball (manifest.json with RepoTags):
containerd's importer turns each RepoTag into the image name, so `ctr images import` gives a
ready-to-run image whose name pods can use with `imagePullPolicy: Never`.

- the pause image: Debian's statically linked `catatonit -P` (an init that just waits)
- the test image `localhost/busybox:e2e`: Debian's static busybox and a link per applet
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from e2e.harness import ociarchive
from e2e.harness.errors import HarnessError

PAUSE_IMAGE = "localhost/pause:e2e"
TEST_IMAGE = "localhost/busybox:e2e"
_BASE_DIRS = {
    "bin": 0o755,
    "dev": 0o755,
    "etc": 0o755,
    "proc": 0o755,
    "run": 0o755,
    "sys": 0o755,
    "tmp": 0o1777,
    "var": 0o755,
}


def _host_binary(name: str, package: str) -> Path:
    found = shutil.which(name)
    if found is None:
        raise HarnessError(f"`{name}` is missing: apt-get install {package} (see e2e/cluster/)")
    return Path(found).resolve()


def _layer(files: dict[str, bytes], links: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in _BASE_DIRS.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return out.getvalue()


def write_image(
    path: Path,
    ref: str,
    layer: bytes,
    *,
    entrypoint: list[str] | None = None,
    cmd: list[str] | None = None,
) -> Path:
    """A docker-archive tarball of one layer, tagged `ref`."""
    run: dict[str, list[str]] = {}
    if entrypoint:
        run["Entrypoint"] = entrypoint
    if cmd:
        run["Cmd"] = cmd
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                **run,
                "WorkingDir": "/",
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": {
                "type": "layers",
                "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"],
            },
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}])
    with tarfile.open(path, "w") as tar:
        for name, data in (
            (config_name, config),
            ("layer.tar", layer),
            ("manifest.json", manifest.encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def pause_image(directory: Path) -> Path:
    catatonit = _host_binary("catatonit", "catatonit").read_bytes()
    layer = _layer({"pause": catatonit}, {})
    return write_image(directory / "pause.tar", PAUSE_IMAGE, layer, entrypoint=["/pause", "-P"])


def busybox_image(directory: Path) -> Path:
    busybox = _host_binary("busybox", "busybox-static")
    listed = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True)
    applets = [a for a in listed.stdout.split() if a != "busybox"]
    layer = _layer({"bin/busybox": busybox.read_bytes()}, {f"bin/{a}": "busybox" for a in applets})
    # Cmd, not Entrypoint, as in the Docker Hub busybox: a pod's `args` replace it.
    return write_image(directory / "busybox.tar", TEST_IMAGE, layer, cmd=["sh"])


if __name__ == "__main__":
    # python -m e2e.harness.images DIR: write pause.tar and busybox.tar (e.g. for `kind load`).
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for tarball in (pause_image(out), busybox_image(out)):
        print(tarball)


def fabricdra_image(directory: Path) -> tuple[Path, str]:
    """The product image built from this checkout by deployments/container/build.sh (Docker-free:
    mmdebstrap + umoci) for this machine's platform only (a native build: no qemu, and CI's time
    stays that of one image); returns the OCI archive and the image reference it carries."""
    script = Path(__file__).resolve().parents[2] / "deployments" / "container" / "build.sh"
    host = ociarchive.host_platform()
    done = subprocess.run(
        [str(script), "--out", str(directory), "--platform", host],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise HarnessError(f"{script} failed (exit {done.returncode}):\n{tail}")
    archive = Path(done.stdout.strip().splitlines()[-1])
    ociarchive.for_platform(archive, host)  # containerd runs the host's image from the index
    return archive, (directory / "image-ref").read_text().strip()


def verification_image(directory: Path, tools: Path) -> tuple[Path, str]:
    """A verification image built by deployments/verification/build.sh (Debian's perftest, and
    the executables in `tools` with python3: the harness's stand-ins); returns the OCI archive
    and the image reference it carries."""
    script = Path(__file__).resolve().parents[2] / "deployments" / "verification" / "build.sh"
    done = subprocess.run(
        [str(script), "--out", str(directory), "--add", str(tools), "--python", "--tag", "e2e"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise HarnessError(f"{script} failed (exit {done.returncode}):\n{tail}")
    archive = Path(done.stdout.strip().splitlines()[-1])
    return archive, (directory / "image-ref").read_text().strip()
