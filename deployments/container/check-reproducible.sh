#!/usr/bin/env bash
# Builds the image twice from this checkout (build.sh, two output folders, one after the other)
# and compares them: the image (manifest) digest, the config digest and every layer digest. On a
# difference it lists the files whose content, mode, owner or time differ between the two
# layers, which is where to look. Exit 0 when both builds are the same image.
#
#   deployments/container/check-reproducible.sh [--keep DIR]
#       DIR  keep both builds there (default: a temporary folder, removed at the end)
#
# Both builds see the same Debian mirror state only if the mirror does not change in between
# (bookworm moves with point and security updates); compare debian-packages.txt when they
# differ. Takes two image builds (312 s measured on 2 busy cores). Needs what build.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
keep=
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=$2; shift 2 ;;
    *) echo "check-reproducible.sh: unknown argument '$1' (expected --keep DIR)" >&2; exit 2 ;;
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
  "$here/build.sh" --out "$work/$run" >/dev/null
  mkdir -p "$work/$run/oci"
  tar -xf "$work/$run/fabricdra-image.tar" -C "$work/$run/oci"
done

# digests: the manifest (the image digest a registry shows), its config and layers
describe() {
  python3 - "$1/oci" <<'PY'
import json, sys
root = sys.argv[1]
index = json.load(open(f"{root}/index.json"))
manifest_digest = index["manifests"][0]["digest"]
algo, hexd = manifest_digest.split(":")
manifest = json.load(open(f"{root}/blobs/{algo}/{hexd}"))
print("image", manifest_digest)
print("config", manifest["config"]["digest"])
for layer in manifest["layers"]:
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
# Per file of the (first) layer: type, mode, owner, mtime, size and content hash.
listing() {
  python3 - "$1/oci" <<'PY'
import gzip, hashlib, json, sys, tarfile
root = sys.argv[1]
index = json.load(open(f"{root}/index.json"))
algo, hexd = index["manifests"][0]["digest"].split(":")
manifest = json.load(open(f"{root}/blobs/{algo}/{hexd}"))
for layer in manifest["layers"]:
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
diff -u "$work/a/debian-packages.txt" "$work/b/debian-packages.txt" >&2 || true
exit 1
