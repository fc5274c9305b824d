"""Records as frozen stdlib dataclasses that pydantic reads as schemas: cheap to define, cheap
to make, and still validated by pydantic wherever input arrives.

Why not pydantic models: `fabricdra inventory` spent about 60 % of its process importing
pydantic and building the inventory's models (issue 21 point 7), while the records it makes
come from code, not from input. pydantic validates stdlib dataclasses the way it validates its
own models (a `TypeAdapter`, or as a field of a model such as `NodeDevicesSpec`) and writes
the same JSON schema for them (a field's `description`, `extra="forbid"` as
`additionalProperties: false`), so the CRDs and every check on input keep their contract; only
a process that reads input pays for pydantic, and only when it does.

`Record` subclasses are keyword-only frozen dataclasses with the few model methods the code
base uses (`model_validate`, `model_dump`, `model_copy`), so callers read as before.
`model_validate` builds the record itself from input whose every value already has its
field's exact type (what a recorded file or the bundled tables hold) and hands anything else
to pydantic — coercion, defaults it must check, and every error message stay pydantic's.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal, Self, dataclass_transform

Extra = Literal["forbid", "ignore", "allow"]
_MISSING: Any = dataclasses.MISSING


def Field(
    default: Any = _MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    description: str | None = None,
    wire_name: str | None = None,
) -> Any:
    """A record field: its default, and what pydantic reads from the dataclass field's metadata
    (`description` for the JSON schema; `wire_name`, pydantic's `alias`, for input and
    schema)."""
    metadata: dict[str, Any] = {}
    if description is not None:
        metadata["description"] = description
    if wire_name is not None:
        metadata["alias"] = wire_name
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(Field,))
class Record:
    """Base of every record: frozen (records are compared, never mutated) and, unless a
    subclass says otherwise, strict about unknown keys, so a typo in a snapshot or a stale
    `--previous` file fails loudly. A subclass sets `__pydantic_config__` (pydantic's
    ConfigDict keys) to change that."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # set per subclass
    __record_fields__: ClassVar[tuple[str, ...]]  # the field names, in order (per subclass)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # `__eq__`, `__hash__` and `__repr__` are Record's own (below: what dataclass writes,
        # read from the field names): Python 3.11's dataclass compiles each method it makes
        # from source, and half of those compiles were most of the records' import time in
        # `fabricdra inventory` (bench/startup.py).
        dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)(cls)
        cls.__record_fields__ = tuple(f.name for f in dataclasses.fields(cls))

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__record_fields__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__record_fields__)
        return f"{type(self).__qualname__}({fields})"

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        """A record from input (a JSON object), validated as pydantic validates it."""
        built = _exact(cls, obj)
        if built is not _REJECT:
            return typing.cast(Self, built)
        return typing.cast(Self, _adapter(cls).validate_python(obj))

    def model_dump(
        self, *, mode: Literal["python", "json"] = "python", exclude_none: bool = False
    ) -> dict[str, Any]:
        """The record as a dict, nested records included, as pydantic's `model_dump` writes it
        (`mode="json"`: datetimes as ISO 8601 text, UTC as `Z`)."""
        out = _dump(self, mode == "json", exclude_none)
        assert isinstance(out, dict)
        return out

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        """A copy with some fields replaced (not validated, as pydantic's is not)."""
        return dataclasses.replace(self, **(update or {}))


def dump(value: Any, *, mode: Literal["python", "json"] = "python") -> Any:
    """Records, lists of them (or anything holding them) as plain data: `Record.model_dump` for
    what is not itself a record (`TypeAdapter(list[X]).dump_python` before)."""
    return _dump(value, mode == "json", False)


def first_error(e: ValueError) -> tuple[str, str]:
    """(where, message) of the first problem in a failed `model_validate`: pydantic's
    location (dotted) and message, or the exception's text for any other ValueError."""
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic's ValidationError (a ValueError)
        first = errors()[0]
        return ".".join(str(x) for x in first["loc"]), str(first["msg"])
    return "", str(e)


_ADAPTERS: dict[type[Record], Any] = {}


def _adapter(cls: type[Record]) -> Any:
    if cls not in _ADAPTERS:
        from pydantic import TypeAdapter

        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _dump(v: Any, json_mode: bool, exclude_none: bool) -> Any:
    if isinstance(v, Record):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(v):
            x = getattr(v, f.name)
            if x is None and exclude_none:
                continue
            out[f.name] = _dump(x, json_mode, exclude_none)
        return out
    if isinstance(v, list | tuple):
        return [_dump(x, json_mode, exclude_none) for x in v]
    if isinstance(v, dict):
        return {k: _dump(x, json_mode, exclude_none) for k, x in v.items()}
    if json_mode and isinstance(v, datetime):
        text = v.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    return v


# What `_exact` returns for input it leaves to pydantic.
_REJECT: Any = object()
_SCALARS = (str, int, bool, float)


_PLANS: dict[type[Record], tuple[Extra, dict[str, tuple[str, Any, bool]]]] = {}


def _plan(cls: type[Record]) -> tuple[Extra, dict[str, tuple[str, Any, bool]]]:
    """How input keys map onto `cls`'s fields: wire key -> (field name, type, required)."""
    if cls not in _PLANS:
        _PLANS[cls] = _make_plan(cls)
    return _PLANS[cls]


def _make_plan(cls: type[Record]) -> tuple[Extra, dict[str, tuple[str, Any, bool]]]:
    config = cls.__pydantic_config__
    extra: Extra = config.get("extra", "ignore")
    hints = typing.get_type_hints(cls)
    keys: dict[str, tuple[str, Any, bool]] = {}
    for f in dataclasses.fields(cls):
        required = f.default is _MISSING and f.default_factory is _MISSING
        keys[f.metadata.get("alias", f.name)] = (f.name, hints[f.name], required)
    return extra, keys


def _exact(tp: Any, v: Any) -> Any:
    """`v` as type `tp` when it already is exactly that type (so pydantic would return it
    unchanged), else `_REJECT`. Deliberately narrow: whatever it does not know, pydantic
    decides."""
    if tp is Any:
        return v
    if tp in _SCALARS:
        return v if type(v) is tp else _REJECT
    if tp is type(None):
        return v if v is None else _REJECT
    if isinstance(tp, type) and issubclass(tp, Record):
        return _record(tp, v) if type(v) is dict else _REJECT
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is types.UnionType or origin is typing.Union:
        if v is None:
            return None if type(None) in args else _REJECT
        arms = [a for a in args if a is not type(None)]
        # One non-None arm only: which arm pydantic's smart union picks for several is its call.
        return _exact(arms[0], v) if len(arms) == 1 else _REJECT
    if origin is Literal:
        return v if any(type(v) is type(a) and v == a for a in args) else _REJECT
    if origin is list and type(v) is list:
        out = [_exact(args[0], x) for x in v]
        return _REJECT if any(x is _REJECT for x in out) else out
    if origin is dict and type(v) is dict and args[0] is str:
        d = {k: _exact(args[1], x) for k, x in v.items() if type(k) is str}
        return _REJECT if len(d) != len(v) or any(x is _REJECT for x in d.values()) else d
    return _REJECT


def _record(cls: type[Record], data: dict[str, Any]) -> Any:
    extra, keys = _plan(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        spec = keys.get(key)
        if spec is None:
            if extra == "ignore":
                continue
            return _REJECT  # pydantic refuses it (forbid) or keeps it (allow)
        x = _exact(spec[1], value)
        if x is _REJECT:
            return _REJECT
        kwargs[spec[0]] = x
    if any(required and name not in kwargs for name, _, required in keys.values()):
        return _REJECT
    return cls(**kwargs)
