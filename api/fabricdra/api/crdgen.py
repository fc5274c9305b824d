"""CustomResourceDefinitions generated from pydantic models: the model is the one source of truth.

    crd = crd_from_model(NodeDevices, group="fabricdra.io", kind="NodeDevices",
                         plural="nodedevices", singular="nodedevices", scope="Cluster",
                         version="v1alpha1")

`model` is the whole object's model. Its `apiVersion`, `kind` and `metadata` fields (if it
declares them) become the standard ones; every other field (`spec`, `status`, ...) is turned
into a *structural* OpenAPI v3 schema, the only kind `apiextensions.k8s.io/v1` accepts:

* every `$ref` is inlined (a recursive model is refused: a structural schema cannot recurse);
* `X | None` becomes X with `nullable: true`; `Literal[...]` becomes an `enum` with its type
  (nullable: a `pattern` of its values, as the API server refuses a null an enum does not allow);
* `dict[str, X]` becomes `additionalProperties: X`, `dict[str, Any]` an object that keeps
  unknown fields (`x-kubernetes-preserve-unknown-fields`);
* keywords Kubernetes does not accept or that would change stored objects are dropped:
  `title`, `default` (a server-side default would make the stored object differ from what a
  writer sent, and a writer comparing the two would rewrite it forever), `additionalProperties:
  false` (implied by a structural schema's pruning), `const` (rewritten as a one-value enum);
* any other union (`A | B`) is refused with the field's path: a structural schema cannot
  express it.

Extras the model cannot carry are arguments: `short_names`, `categories`, `printer_columns`
(additionalPrinterColumns), `validations` (`{"spec": [{"rule": ..., "message": ...}]}` adds
`x-kubernetes-validations` at that dotted path), `status_subresource` (default: on when the
model has a `status` field).

Checked-in CRDs live in `api/crds/<plural>.<group>.yaml`. A module under `fabricdra.api` that
wants one declares `CRD = CrdSource(...)`; `python -m fabricdra.api.crdgen` regenerates every
such file and `--check` fails (exit 1, naming the file) when one is stale.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import pkgutil
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

Scope = Literal["Cluster", "Namespaced"]

_STANDARD_FIELDS = {"apiVersion", "kind", "metadata"}
_DROP = {"title", "default", "examples"}


class CrdError(ValueError):
    """The model cannot be expressed as a structural schema; the message names the field."""


def crd_from_model(
    model: type[BaseModel],
    *,
    group: str,
    kind: str,
    plural: str,
    singular: str,
    scope: Scope,
    version: str,
    short_names: Sequence[str] = (),
    categories: Sequence[str] = (),
    printer_columns: Sequence[Mapping[str, Any]] = (),
    validations: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    status_subresource: bool | None = None,
) -> dict[str, Any]:
    """A complete `apiextensions.k8s.io/v1` CustomResourceDefinition as a dict."""
    raw = model.model_json_schema(mode="serialization", ref_template="#/$defs/{model}")
    defs: dict[str, Any] = raw.get("$defs", {})
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    required = [f for f in raw.get("required", []) if f not in _STANDARD_FIELDS]
    for name, sub in raw.get("properties", {}).items():
        if name in _STANDARD_FIELDS:
            continue
        properties[name] = _structural(sub, defs, name, ())
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if description := raw.get("description"):
        schema["description"] = description
    if required:
        schema["required"] = required
    for path, rules in (validations or {}).items():
        node = _at(schema, path)
        node["x-kubernetes-validations"] = [dict(r) for r in rules]

    names: dict[str, Any] = {"plural": plural, "singular": singular, "kind": kind}
    names["listKind"] = f"{kind}List"
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    ver: dict[str, Any] = {
        "name": version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
    }
    if status_subresource if status_subresource is not None else "status" in properties:
        ver["subresources"] = {"status": {}}
    if printer_columns:
        ver["additionalPrinterColumns"] = [dict(c) for c in printer_columns]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "names": names, "scope": scope, "versions": [ver]},
    }


def _at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in dotted.split(".") if dotted else []:
        try:
            node = node["properties"][part]
        except KeyError:
            raise CrdError(f"validation path {dotted!r}: no field {part!r}") from None
    return node


def _structural(
    node: Mapping[str, Any], defs: Mapping[str, Any], path: str, seen: tuple[str, ...]
) -> dict[str, Any]:
    """One JSON-schema node, rewritten as a structural-schema node."""
    if "$ref" in node:
        ref = str(node["$ref"]).rsplit("/", 1)[-1]
        if ref in seen:
            raise CrdError(f"{path}: {ref} refers to itself; a CRD schema cannot recurse")
        merged = {**defs[ref], **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs, path, (*seen, ref))

    for union in ("anyOf", "oneOf"):
        if union in node:
            options = [o for o in node[union] if o.get("type") != "null"]
            nullable = len(options) < len(node[union])
            if len(options) != 1:
                raise CrdError(f"{path}: a union of several types cannot be a structural schema")
            rest = {k: v for k, v in node.items() if k != union}
            chosen = _structural({**options[0], **rest}, defs, path, seen)
            if nullable:
                chosen["nullable"] = True
                if "enum" in chosen:
                    # The API server checks `enum` even on a null (listing null does not
                    # help: "Unsupported value: null"), so a nullable Literal left unset was
                    # refused. A pattern checks strings only: the same values, null allowed.
                    values = chosen.pop("enum")
                    if chosen.get("type") == "string":
                        chosen["pattern"] = "^(" + "|".join(re.escape(v) for v in values) + ")$"
            return chosen
    if "allOf" in node and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _structural({**node["allOf"][0], **rest}, defs, path, seen)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key in ("$defs", "required", "properties", "items", "allOf"):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "additionalProperties":
            if isinstance(value, Mapping) and value:
                out[key] = _structural(value, defs, f"{path}.*", seen)
            elif value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # False: a structural schema prunes unknown fields anyway.
        else:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"], path)
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {
            k: _structural(v, defs, f"{path}.{k}", seen) for k, v in node["properties"].items()
        }
        if node.get("required"):
            out["required"] = list(node["required"])
    if "items" in node:
        out["items"] = _structural(node["items"], defs, f"{path}[]", seen)
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise CrdError(f"{path}: no type (Any is only allowed as a dict value)")
    return out


def _enum_type(values: Sequence[Any], path: str) -> str:
    kinds = {type(v) for v in values}
    if kinds == {str}:
        return "string"
    if kinds == {bool}:
        return "boolean"
    if kinds <= {int}:
        return "integer"
    raise CrdError(f"{path}: an enum of mixed types cannot be a structural schema")


# --- the checked-in files ----------------------------------------------------------------


@dataclass(frozen=True)
class CrdSource:
    """What a module under `fabricdra.api` declares as `CRD = CrdSource(...)` to have its CRD
    generated into api/crds/."""

    model: type[BaseModel]
    group: str
    kind: str
    plural: str
    singular: str
    scope: Scope
    version: str
    short_names: Sequence[str] = ()
    categories: Sequence[str] = ()
    printer_columns: Sequence[Mapping[str, Any]] = ()
    validations: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"{self.plural}.{self.group}.yaml"

    def crd(self) -> dict[str, Any]:
        return crd_from_model(
            self.model,
            group=self.group,
            kind=self.kind,
            plural=self.plural,
            singular=self.singular,
            scope=self.scope,
            version=self.version,
            short_names=self.short_names,
            categories=self.categories,
            printer_columns=self.printer_columns,
            validations=self.validations,
        )


CRD_DIR = Path(__file__).resolve().parents[2] / "crds"  # api/crds in a source checkout


def sources() -> list[CrdSource]:
    """Every `CRD = CrdSource(...)` declared by a module of fabricdra.api."""
    import fabricdra.api as api

    # Run as `python -m`, this module is __main__: compare with the importable class.
    declared = importlib.import_module("fabricdra.api.crdgen").CrdSource
    found: list[CrdSource] = []
    for info in sorted(pkgutil.iter_modules(api.__path__), key=lambda m: m.name):
        if info.name == "crdgen":
            continue
        module = importlib.import_module(f"fabricdra.api.{info.name}")
        source = getattr(module, "CRD", None)
        if isinstance(source, declared):
            found.append(source)
    return found


def render(crd: Mapping[str, Any]) -> str:
    import yaml  # a build-time tool: pyyaml comes with the dev extras

    header = (
        "# Generated by `python -m fabricdra.api.crdgen` from the pydantic model; do not edit.\n"
    )
    return header + yaml.safe_dump(dict(crd), sort_keys=False, width=100)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fabricdra.api.crdgen", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=CRD_DIR, help="folder of the CRD files")
    p.add_argument("--check", action="store_true", help="fail if a checked-in file is stale")
    args = p.parse_args(argv)
    stale = []
    for source in sources():
        path: Path = args.out / source.filename
        text = render(source.crd())
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path)
    for path_text in stale:
        print(f"stale CRD: {path_text} (run python -m fabricdra.api.crdgen)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
