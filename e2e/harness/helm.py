"""The fabricdra Helm chart, rendered and installed with the real helm (built by build.sh --helm).

chart = Chart()                                   # builds helm first if it is missing
docs = chart.template(values={"rdma": {"mode": "shared"}})   # parsed manifests
chart.install(kubeconfig, namespace, values=...)  # helm upgrade --install --wait
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import binaries
from e2e.harness.errors import HarnessError

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "fabricdra"
# Rendering needs a cluster version; ours is the pinned one (the chart requires >= 1.34).
KUBE_VERSION = binaries.kubernetes_version()
# The last commit whose chart was 0.1.0, the version before the chart was versioned: what an
# upgrade test upgrades from.
PREVIOUS_CHART = "4fc26846819e62d997da06d562e42cea05f256b2"


def chart_at(rev: str, dest: Path) -> Path:
    """The chart as commit `rev` of this repository had it, unpacked under `dest`."""
    repo = CHART_DIR.parents[1]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, "charts/fabricdra"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise HarnessError(f"git archive {rev} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "charts" / "fabricdra"


# What every install by the harness says, as an operator's values file would: its nodes run
# no device plugin (the chart refuses to offer devices without it; docs/coexistence.md).
BASE_VALUES: dict[str, Any] = {"devicePlugins": {"absent": True}}


def merged(base: dict[str, Any], values: dict[str, Any] | None) -> dict[str, Any]:
    """`values` over `base`, maps merged key by key (as helm merges values files)."""
    out = dict(base)
    for k, v in (values or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = v
    return out


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one rendered object of `kind` named `name` (an assertion error names a miss)."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


class Chart:
    def __init__(
        self, chart_dir: Path = CHART_DIR, *, base_values: dict[str, Any] | None = None
    ) -> None:
        """`base_values`: under every call's values (default BASE_VALUES; {} for none)."""
        self.chart_dir = chart_dir
        self.base_values = BASE_VALUES if base_values is None else base_values
        self.helm = binaries.ensure(binaries.HELM, helm=True) / "helm"

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        done = subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, check=False, timeout=timeout
        )
        if check and done.returncode != 0:
            raise HarnessError(
                f"helm {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr.strip()}"
            )
        return done.stdout if done.returncode == 0 else done.stderr

    def _values(self, values: dict[str, Any] | None) -> list[str]:
        # --set-json per top-level key: exact types, no helm --set string parsing.
        values = merged(self.base_values, values)
        return [f"--set-json={k}={json.dumps(v)}" for k, v in values.items()]

    def lint(self) -> str:
        return self.run(
            "lint",
            "--strict",
            f"--kube-version={KUBE_VERSION}",
            *self._values(None),
            str(self.chart_dir),
        )

    def render(
        self,
        values: dict[str, Any] | None = None,
        *,
        namespace: str = "fabricdra-system",
        kube_version: str = KUBE_VERSION,
        check: bool = True,
    ) -> str:
        """The rendered manifests; with `check` False, helm's error output when it fails."""
        return self.run(
            "template",
            "fabricdra",
            str(self.chart_dir),
            f"--namespace={namespace}",
            f"--kube-version={kube_version}",
            *self._values(values),
            check=check,
        )

    def template(
        self,
        values: dict[str, Any] | None = None,
        *,
        namespace: str = "fabricdra-system",
        kube_version: str = KUBE_VERSION,
    ) -> list[dict[str, Any]]:
        rendered = self.render(values, namespace=namespace, kube_version=kube_version)
        return [d for d in yaml.safe_load_all(rendered) if d]

    def notes(
        self, values: dict[str, Any] | None = None, *, namespace: str = "fabricdra-system"
    ) -> str:
        """templates/NOTES.txt as `helm install` would print it. `helm template` renders no
        notes, so a copy of the chart carries the same text as a named template, rendered
        into a ConfigMap."""
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "fabricdra"
            shutil.copytree(self.chart_dir, copy)
            text = (copy / "templates" / "NOTES.txt").read_text()
            (copy / "templates" / "_notes.tpl").write_text(
                '{{- define "harness.notes" -}}\n' + text + "{{- end }}\n"
            )
            (copy / "templates" / "harness-notes.yaml").write_text(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: harness-notes}\n"
                'data: {notes: {{ include "harness.notes" . | quote }}}\n'
            )
            docs = Chart(copy).template(values, namespace=namespace)
        (found,) = [d for d in docs if d["metadata"]["name"] == "harness-notes"]
        return str(found["data"]["notes"])

    def install(
        self,
        kubeconfig: Path,
        namespace: str,
        *,
        release: str = "fabricdra",
        values: dict[str, Any] | None = None,
        timeout: str = "5m",
    ) -> str:
        return self.run(
            "upgrade",
            "--install",
            release,
            str(self.chart_dir),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            "--create-namespace",
            "--wait",
            f"--timeout={timeout}",
            *self._values(values),
        )

    def uninstall(self, kubeconfig: Path, namespace: str, *, release: str = "fabricdra") -> str:
        return self.run(
            "uninstall",
            release,
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            "--wait",
        )


def harness_values(
    cluster: Any, image: str, *, sysfs: Path, dev: Path, proc: Path, nvml: Path
) -> dict[str, Any]:
    """Chart values for the harness's node cluster (`e2e.harness.nodecluster.NodeCluster`): where
    the made-up node's files are, the image imported into its containerd (pull policy Never),
    and, since the harness has no kube-proxy, host networking with the API server's loopback
    address. One controller replica: two on one host network would share a metrics port."""
    repository, _, tag = image.rpartition(":")
    port = str(cluster.server).rsplit(":", 1)[1]
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kubeletRootDir": str(cluster.kubelet_root),
        "sysfsRoot": str(sysfs),
        "devRoot": str(dev),
        "procRoot": str(proc),
        "nvmlSnapshot": str(nvml),
        "discoveryInterval": 2,
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": port},
        ],
        # The harness's node has no NFD labels: run the node pods on it regardless.
        "node": {"hostNetwork": True, "deviceNodeLabels": []},
        "controller": {"hostNetwork": True, "replicas": 1},
        "cleanup": {"hostNetwork": True},
        # No verification image is built here: with the default `verification.activeProbes:
        # auto` the active probes are then off, and the made-up node's devices verify on the
        # probes that read files, as on a newcomer's first install.
    }
