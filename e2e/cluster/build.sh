#!/usr/bin/env bash
# Builds the pinned Kubernetes components from the Go module proxy into
# ~/.cache/fabricdra/k8s-<version>/bin (or $FABRICDRA_CACHE/k8s-<version>/bin), reusing whatever
# is already there, and prints that bin directory as its last line.
#
#   build.sh            etcd, etcdctl, kube-apiserver, kube-controller-manager, kube-scheduler,
#                       kubelet, kubectl
#   build.sh --node     also containerd, containerd-shim-runc-v2, ctr and runc
#   build.sh --helm     also helm
#   build.sh --kueue    also Kueue's manager (kueue) and its CRDs and webhook manifests
#                       (kueue-manifests/), for the Kueue topology-aware scheduling tests
#   build.sh --all      everything
#
# Versions: Kubernetes is pinned in exactly one place, the `require k8s.io/kubernetes` line of
# e2e/cluster/kubernetes/go.mod (that wrapper module maps every k8s.io staging module to its
# published v0.X.Y, which `go install k8s.io/kubernetes/...@v1.X.Y` cannot do). etcd is pinned
# by e2e/cluster/etcd/go.mod, Kueue by e2e/cluster/kueue/go.mod; the node runtime and helm below.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CONTAINERD_VERSION=v2.3.7
RUNC_VERSION=v1.4.4
HELM_VERSION=v3.21.4

want_node=0; want_helm=0; want_kueue=0
for a in "$@"; do
  case "$a" in
    --node) want_node=1 ;;
    --helm) want_helm=1 ;;
    --kueue) want_kueue=1 ;;
    --all) want_node=1; want_helm=1; want_kueue=1 ;;
    *) echo "build.sh: unknown argument '$a' (expected --node, --helm, --kueue or --all)" >&2; exit 2 ;;
  esac
done
command -v go >/dev/null || {
  echo "build.sh: no 'go' on PATH: the harness builds Kubernetes from the Go module proxy and needs Go >= 1.26" >&2; exit 1; }

k8s_version=$(cd "$here/kubernetes" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
CACHE=${FABRICDRA_CACHE:-$HOME/.cache/fabricdra}
BIN="$CACHE/k8s-$k8s_version/bin"
mkdir -p "$BIN"
# One build at a time per cache: test sessions started together (each fixture builds what is
# missing) built the same binary into the same temporary file, and the slower one's `mv`
# failed ("cannot stat .kube-apiserver.tmp"). The second waits, then reuses what the first built.
exec 9>"$CACHE/.build.lock"
flock 9
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=-mod=readonly
log() { printf '[build.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# build_tool MODULE_DIR PACKAGE OUTPUT [ldflags]: one binary, written atomically so an
# interrupted build never leaves a half-written file that a later run would reuse.
build_tool() {
  [ -x "$BIN/$3" ] && return 0
  log "building $3 ($2)"
  (cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags "${4:--s -w}" -o "$BIN/.$3.tmp.$$" "$2")
  mv "$BIN/.$3.tmp.$$" "$BIN/$3"
}

# Kubernetes, with the version stamped the way hack/lib/version.sh stamps it.
minor=${k8s_version#v1.}; minor=${minor%%.*}
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
  build_tool "$here/kubernetes" "k8s.io/kubernetes/cmd/$b" "$b" "$ldf"
done
build_tool "$here/etcd" go.etcd.io/etcd/server/v3 etcd
build_tool "$here/etcd" go.etcd.io/etcd/etcdctl/v3 etcdctl

if [ $want_node = 1 ]; then
  for b in containerd containerd-shim-runc-v2 ctr; do
    [ -x "$BIN/$b" ] && continue
    log "building $b $CONTAINERD_VERSION"
    CGO_ENABLED=0 GOBIN="$BIN" GOFLAGS= go install -trimpath \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      "github.com/containerd/containerd/v2/cmd/$b@$CONTAINERD_VERSION"
  done
  if [ ! -x "$BIN/runc" ]; then
    log "building runc $RUNC_VERSION (cgo: needs gcc, libseccomp-dev and pkg-config)"
    CGO_ENABLED=1 GOBIN="$BIN" GOFLAGS= go install -trimpath -tags "seccomp urfave_cli_no_docs" \
      "github.com/opencontainers/runc@$RUNC_VERSION"
  fi
fi

# helm's default Kubernetes version (`helm template` without --kube-version, `helm lint`) is
# stamped as helm's own Makefile stamps it: its client-go's minor (v0.X.Y -> 1.X). Unstamped it
# is 1.20, which the chart's kubeVersion refuses. The stamp file marks a helm built this way (an
# older unstamped build is rebuilt).
if [ $want_helm = 1 ] && { [ ! -x "$BIN/helm" ] || [ ! -f "$BIN/helm.kube-version" ]; }; then
  log "building helm $HELM_VERSION"
  helm_gomod=$(GOFLAGS= go mod download -json "helm.sh/helm/v3@$HELM_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  client_go=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$helm_gomod")
  [ -n "$client_go" ] || { echo "build.sh: no k8s.io/client-go in $helm_gomod" >&2; exit 1; }
  hldf="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    hldf+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$client_go"
  done
  CGO_ENABLED=0 GOBIN="$BIN" GOFLAGS= go install -trimpath -ldflags "$hldf" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  echo "v1.$client_go.0" > "$BIN/helm.kube-version"
fi

# Kueue: its manager from the wrapper module (go.sum pins every dependency), stamped with its
# version the way Kueue's Makefile stamps it, and beside it what a Kueue install applies and the
# harness cannot take from the binary: the CRDs and the webhook configurations (read from the
# module's source, config/components/). The stamp file holds the version: a different pin
# rebuilds both.
if [ $want_kueue = 1 ]; then
  kueue_version=$(cd "$here/kueue" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)
  if [ "$(cat "$BIN/kueue.version" 2>/dev/null)" != "$kueue_version" ]; then
    log "building kueue $kueue_version"
    rm -f "$BIN/kueue" "$BIN/kueue.version"
    build_tool "$here/kueue" sigs.k8s.io/kueue/cmd/kueue kueue \
      "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
    kueue_dir=$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
    tmp="$BIN/.kueue-manifests.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp/crd"
    cp "$kueue_dir"/config/components/crd/bases/*.yaml "$tmp/crd/"
    cp "$kueue_dir/config/components/webhook/manifests.yaml" "$tmp/webhooks.yaml"
    chmod -R u+w "$tmp"  # the module cache is read-only; a later rebuild must remove this
    rm -rf "$BIN/kueue-manifests" && mv "$tmp" "$BIN/kueue-manifests"
    echo "$kueue_version" > "$BIN/.kueue.version.tmp.$$" && mv "$BIN/.kueue.version.tmp.$$" "$BIN/kueue.version"
  fi
fi

echo "$BIN"
