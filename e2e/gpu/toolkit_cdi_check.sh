#!/usr/bin/env bash
# The NVIDIA container toolkit's CDI path against a real driver, in one short command (issue 32,
# point 8; docs/gpu-checks.md): generate this host's CDI spec with nvidia-ctk (into the workdir:
# /etc/cdi and /var/run/cdi are not touched), prepare one GPU against it with fabricdra's
# prepare, resolve the CDI ids prepare answered into a runc bundle as a CDI runtime does, and
# run `nvidia-smi -L` in it under runc: it must list exactly the prepared GPU, by UUID. Needs
# root (runc) and the tools e2e/gpu/build_toolkit.sh builds. Changes no GPU setting.
#
#   e2e/gpu/toolkit_cdi_check.sh [--tools DIR] [--workdir DIR]
#   e2e/gpu/toolkit_cdi_check.sh --recorded [--tools DIR] [--workdir DIR]
#
#   --tools DIR    runc, nvidia-ctk, nvidia-cdi-hook (default ~/.cache/fabricdra/gpu-tools/bin)
#   --workdir DIR  where the spec, the bundle, runc's state and result.json go (default: temp)
#   --recorded     here-mode, for hosts without a GPU: the tests' sample node and the recorded
#                  spec e2e/gpu/recorded/nvidia-cdi.yaml instead of nvidia-ctk's; the container
#                  lists its GPU nodes and environment (only runc is needed)
#   FABRICDRA_PYTHON=PATH  a python that imports fabricdra (default: the checkout's .venv, else
#                  a new venv with `pip install` of this checkout)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tools=${FABRICDRA_CACHE:-$HOME/.cache/fabricdra}/gpu-tools/bin work="" recorded=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tools) tools=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    --recorded) recorded=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "toolkit_cdi_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work=${work:-$(mktemp -d -t fabricdra-toolkit-check.XXXXXX)}
mkdir -p "$work"
say() { printf '[toolkit_cdi_check.sh] %s\n' "$*" >&2; }
need() { [ -x "$tools/$1" ] || { echo "toolkit_cdi_check.sh: no $tools/$1: run e2e/gpu/build_toolkit.sh" >&2; exit 2; }; }
[ "$(id -u)" = 0 ] || { echo "toolkit_cdi_check.sh: runc needs root" >&2; exit 2; }
need runc

py=${FABRICDRA_PYTHON:-}
if [ -z "$py" ] && [ -x "$repo/.venv/bin/python" ]; then py=$repo/.venv/bin/python; fi
if [ -z "$py" ]; then
  say "installing fabricdra into $work/venv"
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q "$repo"
  py=$work/venv/bin/python
fi

if [ $recorded = 1 ]; then
  say "here-mode: recorded spec, the sample node"
  exec env PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$py" -m e2e.gpu.toolkit_check \
    --work "$work" --recorded --runc "$tools/runc"
fi

command -v nvidia-smi >/dev/null || { echo "toolkit_cdi_check.sh: no nvidia-smi on PATH (not a GPU host? try --recorded)" >&2; exit 2; }
need nvidia-ctk; need nvidia-cdi-hook
mkdir -p "$work/toolkit-cdi"
say "nvidia-ctk cdi generate ($("$tools/nvidia-ctk" --version | head -1))"
"$tools/nvidia-ctk" cdi generate --output "$work/toolkit-cdi/nvidia.yaml" \
  --nvidia-cdi-hook-path "$tools/nvidia-cdi-hook" > "$work/generate.log" 2>&1 \
  || { cat "$work/generate.log" >&2; exit 1; }
nvidia-smi -L > "$work/host-smi-L.txt"
say "prepare, then nvidia-smi -L under runc"
env PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$py" -m e2e.gpu.toolkit_check \
  --work "$work" --toolkit-cdi-dir "$work/toolkit-cdi" --runc "$tools/runc"
