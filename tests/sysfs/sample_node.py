"""Generate the sample node bundled with the package (`fabricdra inventory --sample`).

python -m tests.sysfs.sample_node            rewrite the bundled archive
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path

from fabricdra.kubeletplugin import samples

from .builder import SysfsBuilder
from .nodes import h100_snapshot, hgx_h100

ARCHIVE = Path(samples.__file__).parent / samples.ARCHIVE


def build(into: Path) -> None:
    b = SysfsBuilder(into / samples.SYSFS_DIR)
    hgx = hgx_h100(b, vf_nics=(6, 7), vfs_per_nic=4, broken_nics=(3,))
    snapshot = h100_snapshot(hgx.gpus, mig_gpu=7)
    (into / samples.NVML_SNAPSHOT).write_text(json.dumps(snapshot, indent=2, sort_keys=True) + "\n")


def archive_bytes(tree: Path) -> bytes:
    """A deterministic tar.gz of `tree` (sorted, zero mtimes and owners)."""
    buf = io.BytesIO()
    import gzip

    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for path in sorted(tree.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(tree)))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        ARCHIVE.write_bytes(archive_bytes(Path(tmp)))
    print(f"wrote {ARCHIVE}")


if __name__ == "__main__":
    main()
