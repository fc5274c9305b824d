#!/usr/bin/env bash
# Copies the CRDs and DeviceClasses the chart installs from their single source, api/crds and
# api/deviceclasses, into files/. Helm reads nothing outside the chart folder, so the chart
# carries copies; tests/unit/test_chart.py fails when they drift. Run after changing api/.
#
#   charts/fabricdra/sync-api.sh
set -euo pipefail
chart=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$chart/../.." && pwd)
for kind in crds deviceclasses; do
  rm -rf "$chart/files/$kind"
  mkdir -p "$chart/files/$kind"
  cp "$repo/api/$kind"/*.yaml "$chart/files/$kind/"
done
echo "synced $chart/files/{crds,deviceclasses} from api/" >&2
