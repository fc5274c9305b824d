# Platform handling shared by the Docker-free image builds (deployments/container/build.sh,
# deployments/verification/build.sh): one image per platform, and with two of them one OCI image
# index under one name, so x86_64 nodes and Grace (aarch64) GB200/GB300 trays pull the same
# reference. Sourced, not run.

# arches_of PLATFORMS: the Debian architecture of each comma-separated platform, one a line;
# exits the build with a clear error for anything but linux/amd64 and linux/arm64.
arches_of() {
  local p wanted
  IFS=, read -ra wanted <<< "$1"
  for p in "${wanted[@]}"; do
    case "$p" in
      linux/amd64) echo amd64 ;;
      linux/arm64) echo arm64 ;;
      *) echo "build.sh: unsupported platform '$p' (expected linux/amd64, linux/arm64)" >&2
         return 2 ;;
    esac
  done
}

# machine_of ARCH: the kernel's (and the wheels', and qemu's) name of a Debian architecture.
machine_of() { case "$1" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; esac; }

# require_emulation ARCH...: a foreign architecture's packages run their maintainer scripts (and
# the builds their checks) under qemu, which binfmt_misc must have registered.
require_emulation() {
  local arch host
  host=$(dpkg --print-architecture 2>/dev/null || true)
  for arch in "$@"; do
    if [ "$arch" != "$host" ] && [ ! -e "/proc/sys/fs/binfmt_misc/qemu-$(machine_of "$arch")" ]; then
      echo "build.sh: building linux/$arch on $host needs qemu-$(machine_of "$arch") registered" \
        "in binfmt_misc: apt-get install qemu-user-static (and mount binfmt_misc on" \
        "/proc/sys/fs/binfmt_misc if it is not)" >&2
      return 1
    fi
  done
}

# new_platform_image OCI TAG ARCH COUNT ROOTFS CREATED BY: start the image of one platform in the
# OCI layout from its root file system tarball (one layer) and print its umoci tag: TAG itself,
# or TAG-ARCH when COUNT platforms are built (name_oci_layout then replaces the per-platform tags
# with one image index under TAG).
new_platform_image() {
  local oci=$1 tag=$2 arch=$3 count=$4 rootfs=$5 created=$6 by=$7 ref
  ref=$tag
  [ "$count" -gt 1 ] && ref="$tag-$arch"
  umoci new --image "$oci:$ref" >&2
  umoci raw add-layer --image "$oci:$ref" --history.created "$created" \
    --history.created_by "$by" "$rootfs" >&2
  echo "$ref"
}

# name_oci_layout DIR NAME TAG: give each manifest's descriptor its platform (what a reader picks
# by) and name the image for containerd (io.containerd.image.name, ctr images import). With two
# platforms the manifests go into one image index blob, and index.json lists that index under
# the name, as `docker buildx` writes it.
name_oci_layout() {
  python3 - "$1" "$2" "$3" <<'PY'
import hashlib, json, os, sys
root, name, tag = sys.argv[1:]
path = os.path.join(root, "index.json")
index = json.load(open(path))
for m in index["manifests"]:
    algo, hexd = m["digest"].split(":")
    manifest = json.load(open(os.path.join(root, "blobs", algo, hexd)))
    algo, hexd = manifest["config"]["digest"].split(":")
    config = json.load(open(os.path.join(root, "blobs", algo, hexd)))
    m["platform"] = {"architecture": config["architecture"], "os": config["os"]}
if len(index["manifests"]) > 1:
    # amd64 first, whatever order umoci listed the tags in
    manifests = sorted(index["manifests"], key=lambda m: m["platform"]["architecture"])
    for m in manifests:
        m.pop("annotations", None)  # the per-platform umoci tags
    image_index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    blob = json.dumps(image_index, separators=(",", ":")).encode()
    digest = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(root, "blobs", "sha256", digest), "wb") as f:
        f.write(blob)
    index["manifests"] = [
        {
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": f"sha256:{digest}",
            "size": len(blob),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }
    ]
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), separators=(",", ":"))
PY
}
