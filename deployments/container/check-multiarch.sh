#!/usr/bin/env bash
# Checks a two-platform archive from build.sh (the default build, `make image`): its index lists
# linux/amd64 and linux/arm64, and every native extension (.so) under dist-packages in each image
# is ELF code for that image's machine (`file`: x86-64 / ARM aarch64), via
# `python -m e2e.harness.ociarchive`. Then it smoke-runs the arm64 image: its root file system is
# unpacked from the layer and its own python runs under qemu-aarch64-static -L (user-mode
# emulation, no binfmt_misc needed for this step): the native extensions import and
# `fabricdra --help` runs.
#
#   deployments/container/check-multiarch.sh [ARCHIVE]   (default: build/image/fabricdra-image.tar)
#
# Needs python3, file, tar and (for the smoke run) qemu-user-static; exit 0 when all pass.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
archive=$(realpath "${1:-$repo/build/image/fabricdra-image.tar}")
export PYTHONPATH=$repo
cd "$repo"
python3 -m e2e.harness.ociarchive "$archive" --expect linux/amd64,linux/arm64

qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
if [ -z "$qemu" ] && [ "$(uname -m)" != aarch64 ]; then
  echo "[multiarch] no qemu-aarch64: the arm64 smoke run is skipped (apt-get install qemu-user-static)" >&2
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/fabricdra-multiarch.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"
for digest in $(python3 -c 'import sys
from pathlib import Path
from e2e.harness.ociarchive import for_platform
print(" ".join(for_platform(Path(sys.argv[1]), "linux/arm64").layers))' "$archive"); do
  tar -xOf "$archive" "./blobs/sha256/${digest#sha256:}" | tar -xz -C "$root" --numeric-owner
done
run() { if [ -n "$qemu" ]; then "$qemu" -L "$root" "$root/usr/bin/python3" "$@"; else chroot "$root" /usr/bin/python3 "$@"; fi; }
echo "[multiarch] arm64 image, under ${qemu:-chroot}:"
file -b "$root/usr/bin/python3.11" | cut -d, -f1-2
run -c 'import platform, grpc, pydantic_core, yarl, frozenlist, multidict, fabricdra.cli; print("python", platform.python_version(), "on", platform.machine(), "- imports ok")'
run /usr/local/bin/fabricdra --help | head -3
echo "[multiarch] ok" >&2
