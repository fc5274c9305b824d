#!/usr/bin/env bash
# Builds a verification image (the chart's verification.image, docs/verification.md#the-
# verification-pod) without Docker: a Debian root file system from Debian's own packages
# (mmdebstrap) with perftest's ib_write_bw and the RDMA user-space providers, packed as one OCI
# layer by umoci, as deployments/container/build.sh builds the product image. The node agent
# runs its probe script in it with `sh`; the script needs coreutils' `timeout` (essential) and
# finds the tools on PATH.
#
#   deployments/verification/build.sh [--out DIR] [--tag TAG] [--platform PLATFORMS]
#                                     [--add DIR]... [--python] [--dry-run]
#       DIR (--out)  where fabricdra-verify-image.tar goes (default: build/verification)
#       TAG          image tag (default: the package version from pyproject.toml)
#       PLATFORMS    linux/amd64, linux/arm64, or both comma-separated (default: this machine's):
#                    two give one OCI image index under one name, as for the product image, so
#                    a fleet of x86_64 HGX nodes and Grace (aarch64) GB200/GB300 trays sets one
#                    verification.image (a foreign platform needs qemu-user-static)
#       --add DIR    copy the executables in DIR into the image's /usr/local/bin: NVIDIA's CUDA
#                    tools built per their READMEs (nvbandwidth, nccl-tests' all_reduce_perf;
#                    for the controller's measured loss also all_reduce_perf_mpi, nccl-tests
#                    built with MPI=1; they need the CUDA runtime and NCCL beside them, see
#                    docs/verification.md),
#                    or the harness's stand-ins (tests/standins, which need --python). Machine
#                    code goes in DIR/amd64/ and DIR/arm64/ (each platform takes its own folder;
#                    DIR's own files go into every platform built); an ELF file built for
#                    another machine than the platform's is refused
#       --python     add python3 (the stand-ins are Python scripts)
#       --dry-run    print the recipe (suite, packages, added files) and stop
#   last line printed: the archive's path (or, with --dry-run, the recipe)
#
# Debian bookworm's perftest (4.5+0.17) is linux-rdma/perftest; NVIDIA does not publish
# nvbandwidth or nccl-tests as Debian packages, so they come in with --add, or use an image
# built FROM NVIDIA's CUDA images (docs/verification.md). Needs root, mmdebstrap and umoci.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
SUITE=bookworm
MIRROR=${FABRICDRA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE_NAME=${FABRICDRA_VERIFY_IMAGE_NAME:-ghcr.io/fabricdra/fabricdra-verify}
# perftest: ib_write_bw; ibverbs-providers: the mlx5 (and other) user-space drivers libibverbs
# loads; rdma-core's ibv_devinfo helps an operator look inside the pod. openmpi-bin and
# openssh-server/-client: the controller's multi-node NVLink check launches
# nvbandwidth-multinode with mpirun over sshd in its worker pods (docs/verification.md).
PACKAGES=perftest,ibverbs-providers,ibverbs-utils,openmpi-bin,openssh-server,openssh-client,ca-certificates
out=$repo/build/verification
tag=
platforms=
adds=()
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --platform) platforms=$2; shift 2 ;;
    --add) adds+=("$(cd "$2" && pwd)"); shift 2 ;;
    --python) PACKAGES=$PACKAGES,python3; shift ;;
    --dry-run) dry=1; shift ;;
    *) echo "build.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
tag=${tag:-$version}
# shellcheck source=../lib/platforms.sh
. "$here/../lib/platforms.sh"
platforms=${platforms:-linux/$(dpkg --print-architecture 2>/dev/null || echo amd64)}
arch_list=$(arches_of "$platforms") || exit 2
mapfile -t arches <<< "$arch_list"

# elf_machine FILE: the e_machine of an ELF file (62 x86-64, 183 AArch64), empty for any other.
elf_machine() {
  [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ] || return 0
  od -An -t u2 -j 18 -N 2 "$1" | tr -d ' '
}
declare -A want_machine=([amd64]=62 [arm64]=183)
# added_for ARCH: "SOURCE" lines for the platform: DIR's own files (scripts: any platform)
# and DIR/ARCH's. Machine code at DIR's top level, or in the wrong folder, is refused by name.
added_for() {
  local arch=$1 dir f m
  for dir in "${adds[@]}"; do
    for f in "$dir"/* "$dir/$arch"/*; do
      [ -f "$f" ] || continue
      m=$(elf_machine "$f")
      if [ -n "$m" ] && [ "$m" != "${want_machine[$arch]}" ]; then
        if [ "$(dirname "$f")" = "$dir" ]; then
          echo "build.sh: $f is machine code: put it under $dir/amd64/ or $dir/arm64/" >&2
        else
          echo "build.sh: $f is ELF for machine $m, not linux/$arch's ($(machine_of "$arch"))" >&2
        fi
        return 1
      fi
      echo "$f"
    done
  done
}
declare -A added
for arch in "${arches[@]}"; do
  added[$arch]=$(added_for "$arch") || exit 1
done
if [ "$dry" = 1 ]; then
  echo "image $IMAGE_NAME:$tag"
  echo "suite $SUITE"
  for arch in "${arches[@]}"; do echo "platform linux/$arch"; done
  echo "packages $PACKAGES"
  for arch in "${arches[@]}"; do
    while IFS= read -r f; do
      [ -n "$f" ] && echo "add $f /usr/local/bin/$(basename "$f") linux/$arch"
    done <<< "${added[$arch]}"
  done
  echo "entrypoint sh"
  exit 0
fi
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || {
    echo "build.sh: '$tool' is missing: apt-get install $tool" >&2; exit 1; }
done
require_emulation "${arches[@]}"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
log() { printf '[verify-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/fabricdra-verify-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
oci="$work/oci"
umoci init --layout "$oci"
for arch in "${arches[@]}"; do
  mkdir -p "$work/$arch"
  {
    echo '#!/bin/sh'
    echo 'set -eu'
    echo 'root=$1'
    while IFS= read -r f; do
      [ -n "$f" ] && printf 'install -m 0755 %q "$root/usr/local/bin/%s"\n' "$f" "$(basename "$f")"
    done <<< "${added[$arch]}"
    # The tools must run in the image itself (their libraries resolve; under qemu for a
    # foreign platform).
    echo 'if chroot "$root" ldd /usr/bin/ib_write_bw | grep "not found"; then exit 1; fi'
    echo 'chroot "$root" sh -c "command -v timeout mktemp grep >/dev/null"'
    echo 'rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache"/* "$root/var/log"/* "$root/etc/machine-id"'
  } > "$work/$arch/customize.sh"
  chmod +x "$work/$arch/customize.sh"
  log "mmdebstrap $SUITE linux/$arch ($PACKAGES)"
  mmdebstrap --quiet --variant=essential --architectures="$arch" --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="$work/$arch/customize.sh \"\$1\"" \
    "$SUITE" "$work/$arch/rootfs.tar" "$MIRROR" >&2
  ref=$(new_platform_image "$oci" "$tag" "$arch" "${#arches[@]}" "$work/$arch/rootfs.tar" \
    "$created" "deployments/verification/build.sh: mmdebstrap $SUITE ($PACKAGES)")
  rm -f "$work/$arch/rootfs.tar"
  umoci config --image "$oci:$ref" --created "$created" --history.created "$created" \
    --history.created_by "deployments/verification/build.sh: config" \
    --author "fabricdra" --os linux --architecture "$arch" \
    --config.entrypoint sh --config.workingdir / \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.label "org.opencontainers.image.version=$version"
done
umoci gc --layout "$oci"
name_oci_layout "$oci" "$IMAGE_NAME:$tag" "$tag"
archive="$out/fabricdra-verify-image.tar"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$oci" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
echo "$IMAGE_NAME:$tag" > "$out/image-ref"
log "done: $IMAGE_NAME:$tag (${arches[*]}), archive $(du -h "$archive" | cut -f1)"
echo "$archive"
