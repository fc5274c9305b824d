"""The devices' metadata in the container (KEP-5304, beta in Kubernetes 1.37; agent flag
`--device-metadata`): for each request of a prepared claim, one JSON file a container of the pod
reads at a path it can compute from the claim alone.

The layout and format are upstream's (k8s.io/dynamic-resource-allocation `api/metadata`, the
`DeviceMetadata` type of `metadata.resource.k8s.io/v1alpha1`):

    <dir>/resourceclaims/<claim>/<request>/<driver>-metadata.json
    <dir>/resourceclaimtemplates/<pod claim name>/<request>/<driver>-metadata.json

in `<dir>` = `/var/run/kubernetes.io/dra-device-attributes`,
the second for a claim made from a template (its `resource.kubernetes.io/pod-claim-name`
annotation names it in the pod). Each file lists that request's devices with the attributes the
ResourceSlice publishes for them, in the same wire form. The host file lives in
`<dir>/<claim uid>/<request>/`; the claim's CDI spec bind-mounts it read-only, through one CDI
device per request that every device of the request includes. The claim's UID in the host path
means a claim deleted and made again under the same name never meets its predecessor's files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from . import claimfolders
from .devices import Device
from .kubelet.cdi import ContainerEdits, Mount, write_atomic

log = structlog.get_logger("fabricdra.devicemetadata")

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
API_VERSION = "metadata.resource.k8s.io/v1alpha1"
KIND = "DeviceMetadata"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"  # annotation of a template's claim


@dataclass(frozen=True, slots=True)
class Granted:
    """One device of a request, as allocated (`name`: a shared holder keeps its own name)."""

    name: str
    device: Device


def pod_claim_name(claim: dict[str, Any]) -> str | None:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(POD_CLAIM_NAME)
    return str(value) if value else None


def container_path(driver: str, claim: dict[str, Any], request: str) -> str:
    template = pod_claim_name(claim)
    name = str((claim.get("metadata") or {}).get("name", ""))
    sub, first = (TEMPLATES_SUBDIR, template) if template else (CLAIMS_SUBDIR, name)
    return f"{CONTAINER_DIR}/{sub}/{first}/{request}/{driver}{FILE_SUFFIX}"


def document(
    driver: str, pool: str, claim: dict[str, Any], request: str, devices: Sequence[Granted]
) -> dict[str, Any]:
    # Imported here: resourceslices imports the device kinds, which prepare's callers load.
    from .resourceslices import device_attributes

    meta = claim.get("metadata") or {}
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "generation": 1,
        },
    }
    template = pod_claim_name(claim)
    if template:
        doc["podClaimName"] = template
    doc["requests"] = [
        {
            "name": request,
            "devices": [
                {
                    "driver": driver,
                    "pool": pool,
                    "name": g.name,
                    "attributes": device_attributes(g.device)[0],
                }
                for g in devices
            ],
        }
    ]
    return doc


class MetadataFiles:
    """The host side: `<dir>/<claim uid>/<request>/<driver>-metadata.json`."""

    def __init__(self, directory: str | os.PathLike[str], driver: str) -> None:
        self.dir = Path(directory)
        self.driver = driver

    def host_path(self, claim_uid: str, request: str) -> Path:
        return self.dir / claim_uid / request / f"{self.driver}{FILE_SUFFIX}"

    def write(self, claim_uid: str, request: str, doc: dict[str, Any]) -> Path:
        """Write the file (only when its content changed) and return its host path."""
        path = self.host_path(claim_uid, request)
        data = json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"
        try:
            if path.read_bytes() == data:
                return path
        except OSError:
            pass
        write_atomic(path, data, durable=False)
        return path

    def edits(self, claim: dict[str, Any], claim_uid: str, request: str) -> ContainerEdits:
        return ContainerEdits(
            mounts=(
                Mount(
                    host_path=str(self.host_path(claim_uid, request)),
                    container_path=container_path(self.driver, claim, request),
                    options=("ro", "bind"),
                ),
            )
        )

    def remove(self, claim_uid: str) -> None:
        claimfolders.remove(self.dir, claim_uid)

    def keep_only(self, claim_uids: Iterable[str]) -> None:
        """Remove the files of claims the checkpoint no longer names (another boot's)."""
        claimfolders.keep_only(self.dir, claim_uids, "device metadata")


def device_name(request: str, claim_uid: str) -> str:
    """The claim-level CDI device that mounts one request's file."""
    return f"metadata-{request}-{claim_uid}"
