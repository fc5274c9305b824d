"""The ComputeDomain model and its generated CRD."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from fabricdra.api import computedomain as cd
from fabricdra.api.crdgen import CRD_DIR, render


def test_checked_in_crd_is_generated_from_the_model() -> None:
    path = CRD_DIR / cd.CRD.filename
    assert path.read_text() == render(cd.CRD.crd()), "run: python -m fabricdra.api.crdgen"


def test_crd_has_validation_status_and_columns() -> None:
    crd = yaml.safe_load((CRD_DIR / cd.CRD.filename).read_text())
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["x-kubernetes-validations"][:2] == [
        cd.SPEC_IMMUTABLE_RULE,
        cd.HOST_SINGLE_CHANNEL_RULE,
    ]
    assert spec["required"] == ["channel"]
    assert spec["properties"]["channel"]["properties"]["allocationMode"]["enum"] == [
        "Single",
        "All",
    ]
    assert spec["properties"]["imexMode"]["enum"] == ["managed", "host"]
    assert spec["properties"]["numNodes"]["minimum"] == 1
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["scope"] == "Namespaced"
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Ready", "Channel"}


def _spec(**kw: object) -> dict[str, object]:
    return {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}, **kw}


def test_defaults_and_optional_node_count() -> None:
    spec = cd.ComputeDomainSpec.model_validate(_spec())
    assert spec.channel.allocationMode == "Single"
    assert spec.imexMode == "managed"
    assert spec.numNodes is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_spec(imexMode="shared"), "imexMode"),
        (_spec(numNodes=0), "numNodes"),
        (_spec(numNodes=1025), "numNodes"),
        ({"channel": {"resourceClaimTemplate": {"name": "Bad_Name"}}}, "name"),
        (
            {"channel": {"resourceClaimTemplate": {"name": "x"}, "allocationMode": "Some"}},
            "allocationMode",
        ),
        (_spec(extra=1), "extra"),
        (
            {
                "channel": {"resourceClaimTemplate": {"name": "x"}, "allocationMode": "All"},
                "imexMode": "host",
            },
            "allocationMode All needs imexMode managed",
        ),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        cd.ComputeDomainSpec.model_validate(spec)
    assert field in str(err.value)
