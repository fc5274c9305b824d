"""api/records.py: records are stdlib dataclasses, yet read and written exactly as pydantic
read and wrote them when they were pydantic models — `model_validate` builds what pydantic
builds (itself for exactly typed input, through pydantic otherwise), `model_dump` writes what
pydantic writes, and pydantic still refuses what it refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from fabricdra.api.deviceclasses import DeviceClass, DeviceClassTable
from fabricdra.api.inventory import Accelerator, Interface, LinkRecord, PortReading
from fabricdra.api.records import _REJECT, _exact, dump, first_error
from fabricdra.kubeletplugin.discovery.nvml import SnapshotGpu

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "inventory-sample.json").read_text())


def _sample_snapshot(tmp_path: Path) -> dict[str, Any]:
    import tarfile

    archive = resources.files("fabricdra.kubeletplugin.samples").joinpath("sample-node.tar.gz")
    with archive.open("rb") as f, tarfile.open(fileobj=f, mode="r:gz") as tar:
        member = tar.extractfile("nvml-snapshot.json")
        assert member is not None
        doc: dict[str, Any] = json.loads(member.read())
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def test_a_recorded_snapshot_is_built_without_pydantic_as_pydantic_builds_it(
    tmp_path: Path,
) -> None:
    gpus = _sample_snapshot(tmp_path)
    assert len(gpus) == 8
    for value in gpus.values():
        assert _exact(SnapshotGpu, value) is not _REJECT  # the fast path took it
        assert SnapshotGpu.model_validate(value) == TypeAdapter(SnapshotGpu).validate_python(value)


def test_the_bundled_class_table_is_built_without_pydantic_as_pydantic_builds_it() -> None:
    raw = json.loads(resources.files("fabricdra.api").joinpath("deviceclasses.json").read_text())
    assert _exact(DeviceClassTable, raw) is not _REJECT
    assert DeviceClassTable.model_validate(raw) == TypeAdapter(DeviceClassTable).validate_python(
        raw
    )


def test_golden_records_read_and_written_as_pydantic_does() -> None:
    """The golden document holds a Failed link with a time (not exactly typed: pydantic parses
    it) and every other field kind; writing the records back gives the same document."""
    for cls, key in ((Interface, "interfaces"), (Accelerator, "accelerators")):
        adapter = TypeAdapter(list[cls])  # type: ignore[valid-type]
        ours = [cls.model_validate(x) for x in GOLDEN[key]]
        assert ours == adapter.validate_python(GOLDEN[key])
        assert dump(ours, mode="json") == adapter.dump_python(ours, mode="json") == GOLDEN[key]
        assert dump(ours) == adapter.dump_python(ours)
        for record in ours:
            assert record.model_dump(exclude_none=True) == TypeAdapter(cls).dump_python(
                record, exclude_none=True
            )


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 1, 2, 3, 4, 5),
    ],
)
def test_times_are_written_as_pydantic_writes_them(when: datetime) -> None:
    link = LinkRecord(verdict="Failed", since=when, ports=[PortReading(port=1)])
    assert link.model_dump(mode="json") == TypeAdapter(LinkRecord).dump_python(link, mode="json")


def test_input_not_exactly_typed_is_pydantic_s_to_coerce() -> None:
    # Lax pydantic turns "81559" into 81559, as it did when SnapshotGpu was a model.
    value = {"uuid": "GPU-1", "name": "n", "memoryTotalMiB": "81559", "migMode": False}
    assert _exact(SnapshotGpu, value) is _REJECT
    assert SnapshotGpu.model_validate(value).memoryTotalMiB == 81559
    # A bool is not an int to the fast path either.
    assert _exact(SnapshotGpu, {**value, "memoryTotalMiB": True}) is _REJECT


@pytest.mark.parametrize(
    ("cls", "value", "where"),
    [
        (PortReading, {"port": 1, "stat": "4: ACTIVE"}, "stat"),  # a typo: extra="forbid"
        (PortReading, {"state": "4: ACTIVE"}, "port"),  # required
        (LinkRecord, {"verdict": "Broken"}, "verdict"),  # not one of the Literal's values
        (SnapshotGpu, {"uuid": "GPU-1", "name": "n", "memoryTotalMiB": 1}, "migMode"),
        (DeviceClass, {"class": "x", "label": "l"}, "architecture"),
    ],
)
def test_pydantic_still_refuses_what_it_refused(cls: Any, value: Any, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        cls.model_validate(value)
    assert first_error(err.value)[0] == where


def test_unknown_snapshot_keys_are_tolerated_and_the_wire_name_is_read() -> None:
    gpu = SnapshotGpu.model_validate(
        {"uuid": "GPU-1", "name": "n", "memoryTotalMiB": 1, "migMode": False, "newKey": 3}
    )
    assert gpu.uuid == "GPU-1"
    # DeviceClass's `name` is `class` on the wire; its Python name is accepted too.
    fields = {"label": "l", "architecture": "a", "memoryMiB": 1, "formFactor": "f"}
    assert DeviceClass.model_validate({"class": "x", **fields}).name == "x"
    assert DeviceClass.model_validate({"name": "x", **fields}).name == "x"


def test_model_copy_replaces_fields_and_leaves_the_record_alone() -> None:
    link = LinkRecord(verdict="OK")
    failed = link.model_copy(update={"verdict": "Failed", "reason": "down"})
    assert (failed.verdict, failed.reason) == ("Failed", "down")
    assert (link.verdict, link.reason) == ("OK", None)
    with pytest.raises(AttributeError):
        link.verdict = "Failed"  # type: ignore[misc]


def test_equality_hash_and_repr_are_what_dataclass_would_write() -> None:
    """Record writes `__eq__`, `__hash__` and `__repr__` itself (compiling dataclass's cost
    `fabricdra inventory` start-up time): they answer as the generated ones did, beside a
    plain frozen dataclass of the same fields."""
    import dataclasses

    from fabricdra.api.records import Field, Record

    class Twin(Record):
        name: str
        speed: int | None = Field(default=None)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Plain:
        name: str
        speed: int | None = None

    class Listed(Record):
        links: list[int] = Field(default_factory=list)

    a, b = Twin(name="a", speed=1), Twin(name="a", speed=1)
    assert a == b
    assert a != Twin(name="a", speed=2)
    assert a != Plain(name="a", speed=1)  # another class is never equal, as dataclass's
    assert hash(a) == hash(b) == hash(Plain(name="a", speed=1))
    assert len({a, b, Twin(name="b")}) == 2
    assert repr(a) == repr(Plain(name="a", speed=1)).replace("Plain", "Twin")
    with pytest.raises(TypeError, match="unhashable"):
        hash(Listed(links=[1]))  # a list field: unhashable, as with dataclass's hash
    assert Listed(links=[1]) == Listed(links=[1]) != Listed()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "b"  # type: ignore[misc]
    # Every record has them, a record's subclass too (Interface is an Endpoint).
    assert Interface.__eq__ is Record.__eq__
    assert LinkRecord.__hash__ is Record.__hash__
