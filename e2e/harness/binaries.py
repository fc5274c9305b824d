"""Where the pinned Kubernetes binaries live, and building them with e2e/cluster/build.sh if absent.

The version is read from the wrapper go.mod (the single place it is pinned) instead of asking
`go`, so finding an existing build needs no Go toolchain.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from e2e.harness.errors import HarnessError

CLUSTER_DIR = Path(__file__).resolve().parent.parent / "cluster"
BUILD_SCRIPT = CLUSTER_DIR / "build.sh"

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
NODE = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc")
HELM = ("helm",)
KUEUE = ("kueue",)
# Files build.sh writes beside a binary built the current way; a binary without its file is
# built again (helm: stamped with its default Kubernetes version, build.sh).
STAMPS = {"helm": "helm.kube-version", "kueue": "kueue.version"}


def kubernetes_version() -> str:
    """The pinned k8s.io/kubernetes version, e.g. "v1.36.3"."""
    gomod = (CLUSTER_DIR / "kubernetes" / "go.mod").read_text()
    found = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", gomod, re.MULTILINE)
    if not found:
        raise HarnessError(
            f"{CLUSTER_DIR / 'kubernetes' / 'go.mod'} does not require k8s.io/kubernetes"
        )
    return found.group(1)


def bin_dir() -> Path:
    """The folder build.sh writes into: $FABRICDRA_CACHE (or ~/.cache/fabricdra)/k8s-<v>/bin."""
    cache = Path(os.environ.get("FABRICDRA_CACHE", Path.home() / ".cache" / "fabricdra"))
    return cache / f"k8s-{kubernetes_version()}" / "bin"


def kueue_version() -> str:
    """The pinned sigs.k8s.io/kueue version, e.g. "v0.17.0" (e2e/cluster/kueue/go.mod)."""
    gomod = (CLUSTER_DIR / "kueue" / "go.mod").read_text()
    found = re.search(r"^\s*(?:require\s+)?sigs\.k8s\.io/kueue\s+(v\S+)", gomod, re.MULTILINE)
    if not found:
        raise HarnessError(f"{CLUSTER_DIR / 'kueue' / 'go.mod'} does not require sigs.k8s.io/kueue")
    return found.group(1)


def _present(directory: Path, names: tuple[str, ...]) -> bool:
    return all(
        os.access(directory / n, os.X_OK) and (directory / STAMPS.get(n, n)).is_file()
        for n in names
    ) and ("kueue" not in names or _kueue_current(directory))


def _kueue_current(directory: Path) -> bool:
    """Kueue's stamp names the version it was built from: another pin is built again."""
    return (directory / STAMPS["kueue"]).read_text().strip() == kueue_version() and (
        directory / "kueue-manifests" / "webhooks.yaml"
    ).is_file()


def ensure(
    names: tuple[str, ...] = CONTROL_PLANE,
    *,
    node: bool = False,
    helm: bool = False,
    kueue: bool = False,
) -> Path:
    """Return the bin dir holding `names`, running build.sh first if any is missing.

    A failed build raises HarnessError with the end of build.sh's output: tests that need
    real Kubernetes must fail loudly, never skip.
    """
    directory = bin_dir()
    if _present(directory, names):
        return directory
    args = [
        str(BUILD_SCRIPT),
        *(["--node"] if node else []),
        *(["--helm"] if helm else []),
        *(["--kueue"] if kueue else []),
    ]
    try:
        done = subprocess.run(args, capture_output=True, text=True, check=False)
    except OSError as e:
        raise HarnessError(f"cannot run {BUILD_SCRIPT}: {e}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise HarnessError(
            f"{' '.join(args)} failed (exit {done.returncode}); the real-Kubernetes tests need "
            f"Go >= 1.26 and the Go module proxy to build {', '.join(names)}.\n{tail}"
        )
    built = Path(done.stdout.strip().splitlines()[-1])
    missing = [n for n in names if not _present(built, (n,))]
    if missing:
        raise HarnessError(f"{BUILD_SCRIPT} finished but {built} lacks {', '.join(missing)}")
    return built
