#!/usr/bin/env bash
# Builds the image twice from this checkout (build.sh, two output folders, one after the other)
# and compares them: the image (manifest) digest, the config digest and every layer digest. On a
# difference it lists the files whose content, mode, owner or time differ between the two
# layers, which is where to look. Exit 0 when both builds are the same image.
#
#   deployments/container/check-reproducible.sh [--keep DIR] [--platform PLATFORMS]
#       DIR        keep both builds there (default: a temporary folder, removed at the end)
#       PLATFORMS  build.sh's --platform (default: this machine's, e.g. linux/amd64; pass
#                  linux/amd64,linux/arm64 to compare the two-platform index, qemu needed)
#
# Both builds see the same Debian mirror state only if the mirror does not change in between
# (bookworm moves with point and security updates); compare debian-packages.txt when they
# differ. Takes two image builds (312 s measured on 2 busy cores). Needs what build.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
keep=
case "$(uname -m)" in aarch64) platforms=linux/arm64 ;; *) platforms=linux/amd64 ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=$2; shift 2 ;;
    --platform) platforms=$2; shift 2 ;;
    *) echo "check-reproducible.sh: unknown argument '$1' (expected --keep DIR, --platform P)" >&2
       exit 2 ;;
  esac
done
if [ -n "$keep" ]; then
  work=$keep; mkdir -p "$work"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/fabricdra-repro.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
start=$(date +%s)
for run in a b; do
  echo "[repro] build $run" >&2
  "$here/build.sh" --out "$work/$run" --platform "$platforms" >/dev/null
  mkdir -p "$work/$run/oci"
  tar -xf "$work/$run/fabricdra-image.tar" -C "$work/$run/oci"
done

# digests: the manifest (the image digest a registry shows), its config and layers
describe() {
  python3 - "$1/oci" <<'PY'
import json, sys
root = sys.argv[1]
def blob(digest):
    algo, hexd = digest.split(":")
    return json.load(open(f"{root}/blobs/{algo}/{hexd}"))
index = json.load(open(f"{root}/index.json"))
print("image", index["manifests"][0]["digest"])
pending = list(index["manifests"])
while pending:  # a two-platform build: index.json -> image index -> one manifest per platform
    desc = pending.pop(0)
    body = blob(desc["digest"])
    if "manifests" in body:
        pending.extend(body["manifests"])
        continue
    print("manifest", desc["digest"], desc.get("platform", {}).get("architecture", ""))
    print("config", body["config"]["digest"])
    for layer in body["layers"]:
        print("layer", layer["digest"], layer["size"])
PY
}
describe "$work/a" > "$work/a/digests"
describe "$work/b" > "$work/b/digests"
cat "$work/a/digests"
if cmp -s "$work/a/digests" "$work/b/digests" && cmp -s "$work/a/fabricdra-image.tar" "$work/b/fabricdra-image.tar"; then
  echo "[repro] reproducible: both builds are $(sed -n 's/^image //p' "$work/a/digests") ($(( $(date +%s) - start )) s)" >&2
  exit 0
fi
echo "[repro] the builds differ:" >&2
diff "$work/a/digests" "$work/b/digests" >&2 || true
# Per file of every layer: type, mode, owner, mtime, size and content hash.
listing() {
  python3 - "$1/oci" <<'PY'
import gzip, hashlib, json, sys, tarfile
root = sys.argv[1]
def blob(digest):
    algo, hexd = digest.split(":")
    return json.load(open(f"{root}/blobs/{algo}/{hexd}"))
index = json.load(open(f"{root}/index.json"))
manifests, pending = [], list(index["manifests"])
while pending:
    body = blob(pending.pop(0)["digest"])
    if "manifests" in body:
        pending.extend(body["manifests"])
    else:
        manifests.append(body)
for layer in [layer for m in manifests for layer in m["layers"]]:
    algo, hexd = layer["digest"].split(":")
    with tarfile.open(f"{root}/blobs/{algo}/{hexd}", "r:*") as tar:
        for m in tar:
            digest = ""
            if m.isfile():
                digest = hashlib.sha256(tar.extractfile(m).read()).hexdigest()[:16]
            print(m.name, m.type.decode(), oct(m.mode), m.uid, m.gid, m.mtime, m.size, digest, m.linkname)
PY
}
listing "$work/a" > "$work/a/files"
listing "$work/b" > "$work/b/files"
diff "$work/a/files" "$work/b/files" | head -100 >&2 || true
for listed in "$work"/a/debian-packages-*.txt; do
  diff -u "$listed" "$work/b/$(basename "$listed")" >&2 || true
done
exit 1
