"""Every DeviceClass fabricdra installs, in one table (docs/attributes.md#deviceclasses).

Not to be confused with `deviceclasses.json` (`fabricdra.api.deviceclasses`): that is the table
of *accelerator* classes (`h100-80gb-sxm`), published as a device attribute. This one lists the
Kubernetes DeviceClass objects: name, CEL selector, default `extendedResourceName`, the chart
value that enables the class, and who installs it (the chart, or the ComputeDomain controller at
start).

Everything else is generated from it:

- `api/deviceclasses/<file>.yaml`, the manifests `kubectl apply -f api/deviceclasses/` creates;
- `charts/fabricdra/files/deviceclasses.yaml`, the rows the chart renders (gated by the row's
  `enabledBy` chart value, not by a file name);
- the controller's two compute-domain classes (`fabricdra.controller.objects.device_classes`).

`python -m fabricdra.api.deviceclass_table` (run by `make chart-sync`) rewrites the two files
above; `--check` exits 1, naming each stale file. tests/unit/test_deviceclass_table.py fails
while they drift.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .computedomain import CHANNEL_CLASS, DAEMON_CLASS
from .computedomain import DRIVER as COMPUTE_DOMAIN_DRIVER
from .jsontypes import JSON

DEVICES_DRIVER = "devices.fabricdra.io"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# A chart value's dotted path under `.Values`, e.g. `gpus.enabled`.
_VALUE_PATH = r"^[A-Za-z][A-Za-z0-9]*(\.[A-Za-z][A-Za-z0-9]*)*$"


class ValueIn(_Frozen):
    """A chart value (dotted path under `.Values`) and the values it may have."""

    value: str = Field(pattern=_VALUE_PATH)
    oneOf: tuple[str, ...] = Field(min_length=1)


class DeviceClassRow(_Frozen):
    name: str = Field(description="The DeviceClass's metadata.name.")
    file: str = Field(
        default="",
        description="Its manifest's file name in api/deviceclasses/ (chart-installed classes).",
    )
    description: str = Field(description="One line: what the class selects.")
    selector: str = Field(description="The CEL expression of its one selector.")
    extendedResourceName: str | None = Field(
        default=None,
        description="The name the api/ manifest carries (KEP-5004); the chart takes it from "
        "`extendedResources.<extendedResource>` instead.",
    )
    extendedResource: Literal["gpu", "rdma"] | None = Field(
        default=None, description="The key under the chart's `extendedResources` naming it."
    )
    extendedResourceIf: ValueIn | None = Field(
        default=None,
        description="The chart gives the class its extended resource name only while this "
        "value holds (one class per name in a cluster).",
    )
    enabledBy: str = Field(
        pattern=_VALUE_PATH,
        description="The chart value (dotted path under `.Values`) that installs the class.",
    )
    installedBy: Literal["chart", "controller"] = "chart"

    def manifest(self, extended_resource_name: str | None = None) -> JSON:
        """The DeviceClass object; `extended_resource_name` replaces the default name."""
        spec: JSON = {}
        name = extended_resource_name or self.extendedResourceName
        if name:
            spec["extendedResourceName"] = name
        spec["selectors"] = [{"cel": {"expression": self.selector}}]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": self.name},
            "spec": spec,
        }


def _attr(name: str) -> str:
    return f'device.attributes["{DEVICES_DRIVER}"].{name}'


# The verification gate and the health gate of the basic model (1.34/1.35, where devices carry
# no taints): both attributes are published only there, hence `!has(...) ||`. The line breaks
# are those of the manifests before the table existed, so stored classes compare equal.
_DEVICES_GATE = (
    f'device.driver == "{DEVICES_DRIVER}" && (!has({_attr("verified")}) ||\n'
    f" {_attr('verified')}) &&\n"
    f"(!has({_attr('health')}) ||\n"
    f' {_attr("health")} != "Unhealthy") &&\n'
)


def _devices(condition: str) -> str:
    return _DEVICES_GATE + condition


def _compute_domain(kind: str) -> str:
    attrs = f"device.attributes['{COMPUTE_DOMAIN_DRIVER}']"
    return f"device.driver == '{COMPUTE_DOMAIN_DRIVER}' && {attrs}.type == '{kind}'"


_RDMA_MODES = ("exclusive", "shared", "off")  # charts/fabricdra/values.schema.json rdma.mode

TABLE: tuple[DeviceClassRow, ...] = (
    DeviceClassRow(
        name="gpu.fabricdra.io",
        file="gpu.yaml",
        description="Whole GPUs (not MIG-enabled).",
        selector=_devices(f'{_attr("type")} == "gpu"'),
        extendedResourceName="fabricdra.io/gpu",
        extendedResource="gpu",
        enabledBy="gpus.enabled",
    ),
    DeviceClassRow(
        name="mig.fabricdra.io",
        file="mig.yaml",
        description="MIG instances, one device each (their GPU is not offered whole).",
        selector=_devices(f'{_attr("type")} == "mig"'),
        enabledBy="gpus.enabled",
    ),
    DeviceClassRow(
        name="efa.fabricdra.io",
        file="efa.yaml",
        description="AWS Elastic Fabric Adapter functions, one claim each (offered only where "
        "the node plugin runs with --efa).",
        selector=_devices(f'{_attr("type")} == "efa"'),
        enabledBy="efa.enabled",
    ),
    DeviceClassRow(
        name="gaudi.fabricdra.io",
        file="gaudi.yaml",
        description="Intel Gaudi accelerators, one claim each (offered only where the node "
        "plugin runs with --gaudi).",
        selector=_devices(f'{_attr("type")} == "gaudi"'),
        enabledBy="gaudi.enabled",
    ),
    DeviceClassRow(
        name="rdma-shared.fabricdra.io",
        file="rdma-shared.yaml",
        description="Whole-function RDMA endpoints shared by many holders (nodes in shared "
        "RDMA mode).",
        selector=_devices(f'{_attr("type")} == "rdma" && {_attr("rdmaMode")} == "shared"'),
        extendedResource="rdma",
        extendedResourceIf=ValueIn(value="rdma.mode", oneOf=("shared",)),
        enabledBy="rdma.enabled",
    ),
    DeviceClassRow(
        name="rdma-vf.fabricdra.io",
        file="rdma-vf.yaml",
        description="SR-IOV virtual functions with an RDMA device, one per claim request.",
        selector=_devices(f'{_attr("type")} == "rdma" && {_attr("rdmaMode")} == "vf"'),
        enabledBy="rdma.enabled",
    ),
    DeviceClassRow(
        name="rdma.fabricdra.io",
        file="rdma.yaml",
        description="Whole-function RDMA endpoints held exclusively (nodes in exclusive RDMA "
        "mode).",
        selector=_devices(f'{_attr("type")} == "rdma" && {_attr("rdmaMode")} == "exclusive"'),
        extendedResourceName="fabricdra.io/rdma",
        extendedResource="rdma",
        extendedResourceIf=ValueIn(
            value="rdma.mode", oneOf=tuple(m for m in _RDMA_MODES if m != "shared")
        ),
        enabledBy="rdma.enabled",
    ),
    DeviceClassRow(
        name=CHANNEL_CLASS,
        description="The IMEX channel device of a ComputeDomain's node.",
        selector=_compute_domain("channel"),
        enabledBy="computeDomains.enabled",
        installedBy="controller",
    ),
    DeviceClassRow(
        name=DAEMON_CLASS,
        description="The IMEX daemon device of a ComputeDomain's node.",
        selector=_compute_domain("daemon"),
        enabledBy="computeDomains.enabled",
        installedBy="controller",
    ),
)


def rows(installed_by: Literal["chart", "controller"]) -> list[DeviceClassRow]:
    return [r for r in TABLE if r.installedBy == installed_by]


REPO = Path(__file__).resolve().parents[3]  # in a source checkout
API_DIR = REPO / "api" / "deviceclasses"
CHART_FILE = REPO / "charts" / "fabricdra" / "files" / "deviceclasses.yaml"

_GATES_NOTE = """\
# Attributes and their meaning: docs/attributes.md. `verified` (published only on 1.34/1.35
# clusters, the basic model) is the verification gate: docs/verification.md; `health` (also
# only there, where devices carry no taints) keeps an Unhealthy device out, as the taint does.
"""
_EXTENDED_NOTE = """\
  # Pods may ask `resources.limits: {{{name}: 1}}` with no claim (KEP-5004, beta
  # in Kubernetes 1.36; 1.34/1.35 drop the field unless the DRAExtendedResource gate is on).
  # One DeviceClass per name in a cluster: docs/install.md#extended-resources.
"""


def render_manifest(row: DeviceClassRow) -> str:
    """The api/deviceclasses/ file of a chart-installed class, with its comments."""
    out = [f"# {row.description}\n", _GATES_NOTE]
    out.append("apiVersion: resource.k8s.io/v1\nkind: DeviceClass\n")
    out.append(f"metadata:\n  name: {row.name}\nspec:\n")
    if row.extendedResourceName:
        out.append(_EXTENDED_NOTE.format(name=row.extendedResourceName))
        out.append(f"  extendedResourceName: {row.extendedResourceName}\n")
    # A folded block, one line of CEL per line. Folding joins two lines of equal indentation
    # with a space, so the gate's first line is split once more to read as it did by hand.
    body = row.selector.replace(" && (", " &&\n(", 1).split("\n")
    out.append("  selectors:\n  - cel:\n      expression: >-\n")
    out.extend(f"        {line}\n" for line in body)
    return "".join(out)


def render_chart_file() -> str:
    """charts/fabricdra/files/deviceclasses.yaml: the chart's rows, read by templates/api.yaml."""
    import yaml  # a build-time tool: pyyaml comes with the dev extras

    docs: list[dict[str, Any]] = []
    for row in rows("chart"):
        doc: dict[str, Any] = {"enabledBy": row.enabledBy}
        if row.extendedResource:
            doc["extendedResource"] = row.extendedResource
        if row.extendedResourceIf:
            doc["extendedResourceIf"] = {
                "value": row.extendedResourceIf.value,
                "oneOf": list(row.extendedResourceIf.oneOf),
            }
        # The manifest without its extended resource name: the chart sets it from the values.
        doc["manifest"] = row.manifest()
        doc["manifest"]["spec"].pop("extendedResourceName", None)
        docs.append(doc)
    header = (
        "# Generated by `python -m fabricdra.api.deviceclass_table` (make chart-sync) from\n"
        "# api/fabricdra/api/deviceclass_table.py; do not edit. templates/api.yaml renders each\n"
        "# row whose `enabledBy` chart value (a path under .Values) is true.\n"
    )

    class _Dumper(yaml.SafeDumper):
        pass

    def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
        # A selector as a literal block, one line of CEL per line, as a person would write it.
        style = "|" if "\n" in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    _Dumper.add_representer(str, _text)
    return header + yaml.dump(docs, Dumper=_Dumper, sort_keys=False, width=100)


def outputs() -> dict[Path, str]:
    """Every generated file and its text."""
    out = {API_DIR / r.file: render_manifest(r) for r in rows("chart")}
    out[CHART_FILE] = render_chart_file()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fabricdra.api.deviceclass_table", description=__doc__.split("\n")[0]
    )
    p.add_argument("--check", action="store_true", help="fail if a checked-in file is stale")
    args = p.parse_args(argv)
    files = outputs()
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    # A manifest whose row is gone would still be applied by `kubectl apply -f api/deviceclasses/`.
    extra = sorted(set(API_DIR.glob("*.yaml")) - set(files))
    if args.check:
        for path in [*stale, *extra]:
            print(f"stale: {path} (run python -m fabricdra.api.deviceclass_table)", file=sys.stderr)
        return 1 if stale or extra else 0
    for path in extra:
        path.unlink()
        print(f"removed {path}")
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
