#!/usr/bin/env bash
# Builds the fabricdra OCI image without Docker: a Debian root file system from Debian's own
# packages (mmdebstrap), the fabricdra wheel and its locked dependencies installed into it, packed
# as one OCI layer by umoci. The result is an OCI image archive that `ctr images import`,
# `skopeo copy oci-archive:...` or `podman load` take. Containerfile beside this script builds
# the same image with Docker.
#
#   deployments/container/build.sh [--out DIR] [--tag TAG] [--platform PLATFORMS]
#       DIR        where fabricdra-image.tar goes (default: build/image)
#       TAG        image tag (default: the package version from pyproject.toml)
#       PLATFORMS  linux/amd64, linux/arm64, or both comma-separated (the default): one platform
#                  gives an archive whose index.json lists that image's manifest; two give one
#                  OCI image index (index.json -> an index blob listing both manifests, each with
#                  its platform) under the one name, as `docker buildx` makes it
#   last line printed: the archive's path
#
# A foreign platform (arm64 on an x86_64 host) needs qemu-user-static and binfmt_misc (Debian's
# package registers qemu-aarch64 with the F flag, which chroot needs): mmdebstrap runs the arm64
# packages' maintainer scripts and this script runs the image's python under it (the import
# check, byte-compiling). pip runs on the host either way and picks the target's wheels
# (--platform manylinux..._aarch64), so a foreign build needs no pip or compiler in the image.
# The e2e harness and CI build the host's platform only (a native build, ~5 min on 2 cores).
#
# Pinned inputs: Debian $SUITE (the mirror's current state of that stable suite; the installed
# package versions are written to DIR/debian-packages-<arch>.txt), Python packages from
# requirements.lock (exact versions and sha256 hashes; refresh with lock.sh), and the wheel
# built from this checkout. SOURCE_DATE_EPOCH (default: the last commit's time) fixes every
# timestamp in the layer and the image config: two builds of one checkout at one mirror state
# are the same image (check-reproducible.sh compares them). Needs root, mmdebstrap and umoci.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
SUITE=bookworm
MIRROR=${FABRICDRA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE_NAME=${FABRICDRA_IMAGE_NAME:-ghcr.io/fabricdra/fabricdra}
# shellcheck source=../lib/platforms.sh
. "$here/../lib/platforms.sh"
# What the node agent, the plugins, the controller and the IMEX daemon need at run time (grpcio
# links libstdc++); the `essential` variant brings the rest (dpkg, coreutils, bash).
PACKAGES=python3,libstdc++6,ca-certificates,kmod
out=$repo/build/image
tag=
platforms=linux/amd64,linux/arm64
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --platform) platforms=$2; shift 2 ;;
    *) echo "build.sh: unknown argument '$1' (expected --out DIR, --tag TAG, --platform P)" >&2
       exit 2 ;;
  esac
done
# Debian's name for each platform (the wheels' platform tag is its machine_of, pip --platform).
arch_list=$(arches_of "$platforms") || exit 2
mapfile -t arches <<< "$arch_list"
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || {
    echo "build.sh: '$tool' is missing: apt-get install $tool" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
tag=${tag:-$version}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
require_emulation "${arches[@]}"

mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/fabricdra-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

log "building the wheel from $repo"
python3 -m pip wheel --quiet --no-deps --wheel-dir "$work/wheel" "$repo" >&2
wheel=$(ls "$work"/wheel/fabricdra-*.whl)

# The customize hook runs with the new root as $1, before mmdebstrap packs it. pip runs on the
# host (same Debian release, same CPython minor) and installs into the image's dist-packages the
# wheels of the image's architecture, so the image carries no pip and no compiler.
write_hook() {
  local arch=$1 dir=$2 wa
  wa=$(machine_of "$arch")
  cat > "$dir/customize.sh" <<HOOK
#!/bin/sh
set -eu
root=\$1
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
site=\$root/usr/local/lib/python3.11/dist-packages
python3 -m pip install --quiet --no-cache-dir --no-compile --only-binary=:all: \
  --platform manylinux2014_$wa --platform manylinux_2_28_$wa --platform manylinux_2_34_$wa \
  --python-version 3.11 --implementation cp \
  --require-hashes --no-deps --target "\$site" -r "$here/requirements.lock"
# By name from the wheel's folder, not by path: a path install records it (direct_url.json),
# and the build's temporary folder would make every image different.
python3 -m pip install --quiet --no-cache-dir --no-compile --no-deps --no-index \
  --find-links "$work/wheel" --target "\$site" "fabricdra==$version"
# pip --target puts console scripts here with the host's interpreter in them: ours is below.
rm -rf "\$site/bin"
cat > "\$root/usr/local/bin/fabricdra" <<'PY'
#!/usr/bin/python3
import sys

from fabricdra.cli import main

sys.exit(main())
PY
chmod 0755 "\$root/usr/local/bin/fabricdra"
# Every entry point's imports, native extensions included, load in the image itself.
chroot "\$root" env PYTHONDONTWRITEBYTECODE=1 python3 -c 'import grpc, kubernetes, pydantic, fabricdra.cli, fabricdra.kubeletplugin.agent, fabricdra.kubeletplugin.computedomain.driver, fabricdra.controller.manager'
# Byte code that depends only on the sources: hash-based (no mtimes), a fixed hash seed (set
# and frozenset constants are written in hash order) and one process in a fixed order
# (marshal's back-references depend on what the process compiled before).
chroot "\$root" env PYTHONHASHSEED=0 python3 -m compileall -q -f -j1 --invalidation-mode unchecked-hash /usr/local/lib/python3.11/dist-packages >/dev/null
# The controller's user (the node plugins run as root: kubelet's folders, /dev, the CDI folder).
echo 'fabricdra:x:65532:65532:fabricdra:/nonexistent:/usr/sbin/nologin' >> "\$root/etc/passwd"
echo 'fabricdra:x:65532:' >> "\$root/etc/group"
chroot "\$root" dpkg-query -W -f '\${Package} \${Version}\n' > "$out/debian-packages-$arch.txt"
# The inputs, recorded in the image too: Debian is pinned by suite only (the mirror's state at
# build time), so these versions are what a rebuild must match to give the same digest.
mkdir -p "\$root/usr/share/fabricdra"
cp "$out/debian-packages-$arch.txt" "\$root/usr/share/fabricdra/debian-packages.txt"
cp "$here/requirements.lock" "\$root/usr/share/fabricdra/"
rm -rf "\$root/var/lib/apt/lists"/* "\$root/var/cache"/* "\$root/var/log"/* "\$root/etc/machine-id"
HOOK
  chmod +x "$dir/customize.sh"
}

created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
oci="$work/oci"
umoci init --layout "$oci"
for arch in "${arches[@]}"; do
  mkdir -p "$work/$arch"
  write_hook "$arch" "$work/$arch"
  log "mmdebstrap $SUITE linux/$arch ($PACKAGES)"
  mmdebstrap --quiet --variant=essential --architectures="$arch" --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook="$work/$arch/customize.sh \"\$1\"" \
    "$SUITE" "$work/$arch/rootfs.tar" "$MIRROR" >&2

  log "packing the OCI image $IMAGE_NAME:$tag (linux/$arch)"
  ref=$(new_platform_image "$oci" "$tag" "$arch" "${#arches[@]}" "$work/$arch/rootfs.tar" \
    "$created" "deployments/container/build.sh: mmdebstrap $SUITE + fabricdra $version")
  layer_size=$(du -h "$work/$arch/rootfs.tar" | cut -f1)
  rm -f "$work/$arch/rootfs.tar"
  umoci config --image "$oci:$ref" --created "$created" --history.created "$created" \
    --history.created_by "deployments/container/build.sh: config" \
    --author "fabricdra" --os linux --architecture "$arch" --config.user 65532:65532 \
    --config.entrypoint /usr/local/bin/fabricdra --config.workingdir / \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.source=https://github.com/fabricdra/fabricdra" \
    --manifest.annotation "org.opencontainers.image.version=$version"
  log "linux/$arch: layer $layer_size uncompressed"
done
umoci gc --layout "$oci"
name_oci_layout "$oci" "$IMAGE_NAME:$tag" "$tag"
archive="$out/fabricdra-image.tar"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$oci" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
echo "$IMAGE_NAME:$tag" > "$out/image-ref"
log "done in $(( $(date +%s) - start )) s: $IMAGE_NAME:$tag (${arches[*]}), archive $(du -h "$archive" | cut -f1)"
echo "$archive"
