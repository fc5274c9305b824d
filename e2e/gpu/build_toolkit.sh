#!/usr/bin/env bash
# Builds what e2e/gpu/toolkit_cdi_check.sh carries to a GPU host, from their Go modules (the
# module proxy): runc, and the NVIDIA container toolkit's nvidia-ctk and nvidia-cdi-hook. The
# binaries are never committed; the folder is printed as the last line.
#
#   e2e/gpu/build_toolkit.sh [--out DIR]     default: ~/.cache/fabricdra/gpu-tools/bin
#
# nvidia-ctk and nvidia-cdi-hook need cgo (NVML is loaded with dlopen through go-nvml), so gcc;
# runc needs gcc, libseccomp-dev and pkg-config (e2e/cluster/apt-packages.txt). runc is the
# harness's version (e2e/cluster/build.sh) and is copied from the harness's cache when built.
set -euo pipefail
RUNC_VERSION=v1.4.4
TOOLKIT_VERSION=v1.20.2
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "build_toolkit.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
CACHE=${FABRICDRA_CACHE:-$HOME/.cache/fabricdra}
out=${out:-$CACHE/gpu-tools/bin}
mkdir -p "$out"
command -v go >/dev/null || { echo "build_toolkit.sh: no 'go' on PATH (Go >= 1.26)" >&2; exit 1; }
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=
log() { printf '[build_toolkit.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ ! -x "$out/runc" ]; then
  harness=$(ls -d "$CACHE"/k8s-*/bin/runc 2>/dev/null | head -1 || true)
  if [ -n "$harness" ]; then
    log "runc: the harness's ($harness)"
    cp "$harness" "$out/.runc.tmp" && mv "$out/.runc.tmp" "$out/runc"
  else
    log "building runc $RUNC_VERSION"
    CGO_ENABLED=1 GOBIN="$out" go install -trimpath -tags "seccomp urfave_cli_no_docs" \
      "github.com/opencontainers/runc@$RUNC_VERSION"
  fi
fi
for b in nvidia-ctk nvidia-cdi-hook; do
  [ -x "$out/$b" ] && continue
  log "building $b $TOOLKIT_VERSION"
  CGO_ENABLED=1 GOBIN="$out" go install -trimpath \
    -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=$TOOLKIT_VERSION" \
    "github.com/NVIDIA/nvidia-container-toolkit/cmd/$b@$TOOLKIT_VERSION"
done
echo "$out"
