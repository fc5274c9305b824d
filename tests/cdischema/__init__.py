"""The CDI specification's own JSON schema (copied unchanged from /work/shared/cdi, see
SOURCE.md): `validate(doc)` raises jsonschema.ValidationError for a spec no CDI loader takes."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

HERE = Path(__file__).parent


@cache
def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((HERE / "schema.json").read_text())
    defs = json.loads((HERE / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=_draft7())
    )
    return jsonschema.Draft7Validator(schema, registry=registry)


def _draft7() -> Any:
    from referencing.jsonschema import DRAFT7

    return DRAFT7


def validate(doc: dict[str, Any]) -> None:
    _validator().validate(doc)
