#!/usr/bin/env bash
# Stops the cluster up.sh started and undoes what it did to the machine: kills pods, daemons
# and shims, unmounts, removes its cgroups and CNI bridge, restores the kernel sysctls the
# kubelet changed, and deletes its working directory.
#
#   down.sh [--base DIR]   (the same DIR given to up.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# The harness needs the package's dependencies (kubernetes client, ...): the system python3
# has none of them, so make the project's virtual environment first (a no-op when it is there).
make -C "$repo" --no-print-directory venv >&2
py="$repo/.venv/bin/python"
cd "$repo" && exec "$py" -m e2e.harness.nodecluster down "$@"
