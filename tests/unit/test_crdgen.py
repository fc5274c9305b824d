"""The CRD generator: structural schemas from pydantic models, and the checked-in files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from fabricdra.api import crdgen
from fabricdra.api.crdgen import CrdError, crd_from_model
from fabricdra.api.nodedevices import CRD


class _Inner(BaseModel):
    mode: Literal["a", "b"]
    fixed: Literal["only"] = "only"
    count: int | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)


class _Spec(BaseModel):
    name: str = Field(description="The name.")
    inner: _Inner | None = None
    items: list[_Inner] = Field(default_factory=list)


class _Status(BaseModel):
    ready: bool = False


class _Obj(BaseModel):
    apiVersion: str = "x.io/v1"
    kind: str = "Obj"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: _Spec
    status: _Status = Field(default_factory=_Status)


def _gen(model: type[BaseModel], **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "group": "x.io",
        "kind": "Obj",
        "plural": "objs",
        "singular": "obj",
        "scope": "Namespaced",
        "version": "v1",
    }
    return crd_from_model(model, **{**args, **kw})


def _walk(node: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(node, dict):
        out.append(node)
        for v in node.values():
            out.extend(_walk(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_walk(v))
    return out


def test_schema_is_structural() -> None:
    crd = _gen(_Obj, validations={"spec": [{"rule": "self == oldSelf", "message": "immutable"}]})
    assert crd["metadata"]["name"] == "objs.x.io"
    (ver,) = crd["spec"]["versions"]
    assert ver["subresources"] == {"status": {}}
    schema = ver["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    spec = schema["properties"]["spec"]
    assert spec["x-kubernetes-validations"] == [{"rule": "self == oldSelf", "message": "immutable"}]
    assert spec["properties"]["name"] == {"type": "string", "description": "The name."}
    inner = spec["properties"]["inner"]
    assert inner["nullable"] is True
    assert inner["type"] == "object"
    assert inner["properties"]["mode"] == {"type": "string", "enum": ["a", "b"]}
    assert inner["properties"]["fixed"] == {"type": "string", "enum": ["only"]}
    assert inner["properties"]["count"] == {"type": "integer", "nullable": True}
    assert inner["properties"]["tags"] == {
        "type": "object",
        "additionalProperties": {"type": "string"},
    }
    assert inner["properties"]["extra"] == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert spec["properties"]["items"]["items"]["properties"].keys() == inner["properties"].keys()
    for node in _walk(schema):
        assert not (
            {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "default", "const"} & set(node)
        )
        if node is not schema and "properties" in node:
            assert node.get("additionalProperties") is None
        if isinstance(node.get("type"), str):
            assert node["type"] in ("object", "array", "string", "integer", "number", "boolean")


def test_refusals_name_the_field() -> None:
    class Loop(BaseModel):
        child: Loop | None = None

    class LoopObj(BaseModel):
        spec: Loop

    with pytest.raises(CrdError, match="cannot recurse"):
        _gen(LoopObj)

    class Either(BaseModel):
        value: int | str

    class EitherObj(BaseModel):
        spec: Either

    with pytest.raises(CrdError, match=r"spec\.value: a union"):
        _gen(EitherObj)
    with pytest.raises(CrdError, match="no field 'nope'"):
        _gen(_Obj, validations={"spec.nope": [{"rule": "true"}]})


def test_nodedevices_crd_is_cluster_scoped_with_the_inventory_schema() -> None:
    crd = CRD.crd()
    assert crd["metadata"]["name"] == "nodedevices.fabricdra.io"
    assert crd["spec"]["scope"] == "Cluster"
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    iface = spec["properties"]["interfaces"]["items"]
    assert "virtualFunctions" in iface["properties"]
    assert iface["properties"]["link"]["properties"]["verdict"]["enum"] == [
        "OK",
        "Unverified",
        "Failed",
    ]
    acc = spec["properties"]["groups"]["items"]["properties"]["accelerators"]["items"]
    assert "fabric" in acc["properties"]["topology"]["properties"]
    # status.verification is written by the node agent through the status subresource.
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    verification = status["properties"]["verification"]["properties"]
    assert verification["state"]["enum"] == ["Verified", "Unverified", "Failed", "Overridden"]


def test_checked_in_crds_match_a_fresh_generation(tmp_path: Path) -> None:
    sources = crdgen.sources()
    assert CRD.filename in {s.filename for s in sources}
    for source in sources:
        checked_in = crdgen.CRD_DIR / source.filename
        assert checked_in.read_text() == crdgen.render(source.crd()), (
            f"{checked_in} is stale: run python -m fabricdra.api.crdgen"
        )
    assert crdgen.main(["--check"]) == 0
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 0


class _Optional(BaseModel):
    role: Literal["compute", "storage"] | None = None


class _OptionalObj(BaseModel):
    apiVersion: str = "x.io/v1"
    kind: str = "Obj"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: _Optional


def test_a_nullable_enum_is_a_pattern() -> None:
    """The API server checks `enum` even on a null (listing null does not help): an unset
    optional Literal was refused (a NodeDevices record with an unknown NIC role, issue 27;
    tests/integration/test_scaleout_scheduling.py publishes one to a real API server)."""
    crd = _gen(_OptionalObj)
    (ver,) = crd["spec"]["versions"]
    role = ver["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["role"]
    assert role == {"type": "string", "nullable": True, "pattern": "^(compute|storage)$"}
