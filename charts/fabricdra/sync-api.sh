#!/usr/bin/env bash
# Brings the chart's API objects up to date with their single sources in api/:
# - the CRDs: copies of api/crds (generated from the pydantic models by crdgen);
# - the DeviceClasses: files/deviceclasses.yaml (and the manifests in api/deviceclasses/),
#   generated from the table api/fabricdra/api/deviceclass_table.py.
# Helm reads nothing outside the chart folder, so the chart carries copies; tests/integration/test_chart.py
# and tests/unit/test_deviceclass_table.py fail when they drift. Run after changing api/.
#
#   charts/fabricdra/sync-api.sh        (PYTHON: the interpreter with fabricdra installed)
set -euo pipefail
chart=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$chart/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
"$python" -m fabricdra.api.deviceclass_table
rm -rf "$chart/files/crds"
mkdir -p "$chart/files/crds"
cp "$repo/api/crds"/*.yaml "$chart/files/crds/"
echo "synced $chart/files/{crds,deviceclasses.yaml} from api/" >&2
