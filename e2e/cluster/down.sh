#!/usr/bin/env bash
# Stops the cluster up.sh started and undoes what it did to the machine: kills pods, daemons
# and shims, unmounts, removes its cgroups and CNI bridge, restores the kernel sysctls the
# kubelet changed, and deletes its working directory.
#
#   down.sh [--base DIR]   (the same DIR given to up.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py="$repo/.venv/bin/python"; [ -x "$py" ] || py=python3
cd "$repo" && exec "$py" -m e2e.harness.nodecluster down "$@"
