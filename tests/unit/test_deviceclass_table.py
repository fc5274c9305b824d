"""The one DeviceClass table (fabricdra.api.deviceclass_table): what is generated from it matches
it, and every installer takes its classes from it."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fabricdra.api import deviceclass_table as table
from fabricdra.controller import objects


def test_checked_in_files_are_a_fresh_generation() -> None:
    for path, text in table.outputs().items():
        assert path.is_file(), f"{path} missing: run python -m fabricdra.api.deviceclass_table"
        assert path.read_text() == text, (
            f"{path} is stale: run python -m fabricdra.api.deviceclass_table"
        )
    assert table.main(["--check"]) == 0


def test_api_deviceclasses_holds_exactly_the_chart_rows() -> None:
    # `kubectl apply -f api/deviceclasses/` must install no class the table dropped.
    on_disk = sorted(p.name for p in table.API_DIR.glob("*.yaml"))
    assert on_disk == sorted(r.file for r in table.rows("chart"))


def test_each_manifest_is_its_rows_object() -> None:
    for row in table.rows("chart"):
        assert yaml.safe_load((table.API_DIR / row.file).read_text()) == row.manifest()


def test_names_and_files_are_unique_and_every_chart_row_has_a_file() -> None:
    names = Counter(r.name for r in table.TABLE)
    assert [n for n, c in names.items() if c > 1] == []
    files = [r.file for r in table.rows("chart")]
    assert all(files)
    assert len(files) == len(set(files))
    assert [r.file for r in table.rows("controller")] == ["", ""]


def test_the_chart_file_gates_each_row_by_its_table_field() -> None:
    rows = yaml.safe_load(table.CHART_FILE.read_text())
    assert {r["manifest"]["metadata"]["name"]: r["enabledBy"] for r in rows} == {
        r.name: r.enabledBy for r in table.rows("chart")
    }
    # The chart names the extended resource from its values, never from the file.
    assert all("extendedResourceName" not in r["manifest"]["spec"] for r in rows)


def test_the_controller_creates_the_tables_compute_domain_classes() -> None:
    assert objects.device_classes() == [r.manifest() for r in table.rows("controller")]
    assert [c["metadata"]["name"] for c in objects.device_classes()] == [
        "compute-domain-channel.fabricdra.io",
        "compute-domain-daemon.fabricdra.io",
    ]


def test_a_row_with_an_unknown_field_or_a_bad_gate_is_refused() -> None:
    with pytest.raises(ValidationError, match="enabeldBy"):
        table.DeviceClassRow.model_validate(
            {"name": "x", "description": "x", "selector": "true", "enabeldBy": "gpus.enabled"}
        )
    with pytest.raises(ValidationError, match="enabledBy"):
        table.DeviceClassRow(name="x", description="x", selector="true", enabledBy="gpus enabled")


def _chart_value(values: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        assert isinstance(values, dict), path
        assert key in values, f"{path}: no {key!r} in charts/fabricdra/values.yaml"
        values = values[key]
    return values


def test_every_chart_value_a_row_names_is_in_the_chart() -> None:
    # templates/api.yaml walks these paths; one the chart does not have fails every render.
    values = yaml.safe_load((table.CHART_FILE.parents[1] / "values.yaml").read_text())
    for row in table.TABLE:
        assert isinstance(_chart_value(values, row.enabledBy), bool), row.name
        if row.extendedResource:
            _chart_value(values, f"extendedResources.{row.extendedResource}")
        if row.extendedResourceIf:
            _chart_value(values, row.extendedResourceIf.value)


def test_each_extended_resource_name_goes_to_one_class_whatever_the_chart_value() -> None:
    # One DeviceClass per extended resource name in a cluster: for every value the chart's
    # schema allows, exactly one row of a key is given the name.
    schema = json.loads((table.CHART_FILE.parents[1] / "values.schema.json").read_text())
    for key in ("gpu", "rdma"):
        named = [r for r in table.rows("chart") if r.extendedResource == key]
        conditional = [r.extendedResourceIf for r in named if r.extendedResourceIf]
        if not conditional:
            assert len(named) == 1, key
            continue
        assert len(conditional) == len(named), key
        path = {c.value for c in conditional}
        assert len(path) == 1, key
        node = schema
        for part in path.pop().split("."):
            node = node["properties"][part]
        for allowed in node["enum"]:
            assert sum(allowed in c.oneOf for c in conditional) == 1, (key, allowed)
