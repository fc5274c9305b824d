#!/usr/bin/env bash
# One command for a real GPU host (no cluster): install fabricdra in a venv, record NVML
# (`fabricdra nvml-snapshot`), run `fabricdra inventory` and `fabricdra verify`, and compare what
# fabricdra says with nvidia-smi: GPU count, UUID, PCI bus id, NUMA node, MIG mode, NVLink state,
# driver and CUDA versions. Prints a table; exits non-zero on any disagreement (or a failed
# step). Read-only: it queries, it changes no GPU setting (no -r, -pm, -mig, -c, ...).
#
#   e2e/gpu/check.sh [--workdir DIR] [--sysfs-root DIR] [--nvml-snapshot FILE]
#
#   --workdir DIR         where the venv and every answer are kept (default: a new temp folder)
#   --sysfs-root DIR      sysfs tree to read (default /sys)
#   --nvml-snapshot FILE  use these recorded NVML answers instead of recording the host's
#                         (the test suite's recorded host; a GPU host never needs it)
#   FABRICDRA=PATH        an installed `fabricdra` to use instead of installing into a venv
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work="" sysfs=/sys snapshot=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workdir) work=$2; shift 2 ;;
    --sysfs-root) sysfs=$2; shift 2 ;;
    --nvml-snapshot) snapshot=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work=${work:-$(mktemp -d -t fabricdra-gpu-check.XXXXXX)}
mkdir -p "$work"
say() { printf '[check.sh] %s\n' "$*" >&2; }
command -v nvidia-smi >/dev/null || { echo "check.sh: no nvidia-smi on PATH" >&2; exit 2; }

if [ -n "${FABRICDRA:-}" ]; then
  fab=$FABRICDRA
else
  say "installing fabricdra into $work/venv"
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q "$repo"
  fab="$work/venv/bin/fabricdra"
fi



if [ -n "$snapshot" ]; then
  cp "$snapshot" "$work/nvml.json"
else
  say "recording NVML: fabricdra nvml-snapshot"
  "$fab" nvml-snapshot -o "$work/nvml.json"
fi
say "fabricdra inventory"
"$fab" inventory --sysfs-root "$sysfs" --nvml-snapshot "$work/nvml.json" \
  --node-name "$(uname -n)" > "$work/inventory.json"
say "fabricdra verify (no bandwidth tools)"
verify_rc=0
"$fab" verify --sysfs-root "$sysfs" --nvml-snapshot "$work/nvml.json" --no-bandwidth \
  > "$work/verify.txt" || verify_rc=$?

say "nvidia-smi (queries only)"
nvidia-smi --query-gpu=index,uuid,pci.bus_id,mig.mode.current,driver_version \
  --format=csv,noheader > "$work/smi-query.csv"
nvidia-smi > "$work/smi.txt"
nvidia-smi topo -m > "$work/smi-topo.txt"
while IFS=, read -r index _; do
  nvidia-smi nvlink --status -i "$index" > "$work/smi-nvlink-$index.txt" || true
done < "$work/smi-query.csv"

compare_rc=0
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" python3 -m e2e.gpu.compare \
  --inventory "$work/inventory.json" --snapshot "$work/nvml.json" --smi-dir "$work" \
  --sysfs-root "$sysfs" \
  || compare_rc=$?
echo
echo "fabricdra verify (exit $verify_rc):"
cat "$work/verify.txt"
say "answers kept in $work"
[ "$compare_rc" = 0 ] && [ "$verify_rc" = 0 ]
