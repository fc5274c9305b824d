#!/usr/bin/env bash
# Brings up a one-node Kubernetes cluster on this machine in the background: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager, containerd and a kubelet, on
# loopback. Builds whatever binaries are missing first. Waits until the node is Ready; the
# last line printed is the cluster-admin kubeconfig. Stop it with down.sh.
#
#   up.sh [--base DIR] [--install]
#     --base DIR   default /var/lib/fabricdra-e2e; logs in DIR/control-plane/logs
#     --install    also build the fabricdra image from this checkout and install the chart on
#                  the node, made to look like the 8-GPU HGX sample node, then run a sample pod
#                  (default/fabricdra-sample) with a "GPU + its own NIC" claim and print what
#                  it sees (docs/install.md)
#
# The node is called 127.0.0.1; the image localhost/busybox:e2e is preloaded (use
# imagePullPolicy: Never). Needs root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
"$here/install-deps.sh"
"$here/build.sh" --all >&2
# The harness needs the package's dependencies (kubernetes client, ...): the system python3
# has none of them, so make the project's virtual environment first (a no-op when it is there).
make -C "$repo" --no-print-directory venv >&2
py="$repo/.venv/bin/python"
cd "$repo" && exec "$py" -m e2e.harness.nodecluster up "$@"
