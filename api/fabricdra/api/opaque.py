"""The opaque configuration the ComputeDomain controller and the compute-domain node plugin
exchange: the `parameters` of a claim's `devices.config[].opaque` for driver
`compute-domain.fabricdra.io` (docs/compute-domains.md#opaque-configuration).

Defined once, validated on both sides: the controller builds the parameters it writes into its
ResourceClaimTemplates through these models (`ChannelConfig.build`) and reads claims back through
them (`ChannelConfig.validated`); the node plugin parses them at prepare (`parse_opaque`). A bad
configuration is refused on either side with the same `OpaqueConfigError`, whose message names
the kind and every bad field.

Unknown fields are ignored, not refused: a claim outlives a controller upgrade, and a node plugin
one release behind must still prepare claims made from a newer controller's template. Fields are
only ever added with a default, so a claim from an older template still reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .computedomain import (
    API_VERSION,
    CHANNEL_COUNT,
    DAEMON_OPAQUE_KIND,
    GROUP,
    OPAQUE_KIND,
    AllocationMode,
    ImexMode,
)
from .jsontypes import JSON

# A Kubernetes UID is a UUID; the daemon side names a host folder after it, so nothing that
# could climb out of that folder (`/`, `..`) may pass.
_UID = r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class OpaqueConfigError(ValueError):
    """A compute-domain opaque configuration that does not validate; the message names the
    kind and every bad field."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    apiVersion: str = Field(default=API_VERSION, pattern=rf"^{GROUP.replace('.', '[.]')}/v\w+$")
    domainUID: str = Field(min_length=1, max_length=128, pattern=_UID)
    domainName: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    namespace: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL)

    @classmethod
    def build(cls, **fields: Any) -> Self:
        """The model from its fields, or an OpaqueConfigError naming the bad ones."""
        return cls.validated({"kind": cls.model_fields["kind"].default, **fields})

    @classmethod
    def validated(cls, params: Mapping[str, Any]) -> Self:
        try:
            return cls.model_validate(dict(params))
        except ValidationError as e:
            raise OpaqueConfigError(_describe(cls.model_fields["kind"].default, e)) from None

    def params(self) -> JSON:
        """The parameters as written into a claim template, keys sorted: the API server stores
        them as raw bytes, and a later status patch that re-serialises the claim (sorting map
        keys) would otherwise change an allocation's bytes, which it refuses as immutable."""
        return dict(sorted(self.model_dump(mode="json").items()))


class ChannelConfig(_Config):
    """A workload claim's config: which domain, which IMEX channel (device `channel`)."""

    kind: Literal["ComputeDomainChannelConfig"] = OPAQUE_KIND
    channel: int = Field(ge=0, lt=CHANNEL_COUNT)
    allocationMode: AllocationMode = "Single"
    imexMode: ImexMode = "managed"


class DaemonConfig(_Config):
    """An IMEX daemon claim's config: which domain it serves (device `daemon`)."""

    kind: Literal["ComputeDomainDaemonConfig"] = DAEMON_OPAQUE_KIND


_KINDS: dict[str, type[ChannelConfig] | type[DaemonConfig]] = {
    OPAQUE_KIND: ChannelConfig,
    DAEMON_OPAQUE_KIND: DaemonConfig,
}


def _describe(kind: str, error: ValidationError) -> str:
    fields = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()
    )
    return f"invalid {kind}: {fields}"


def parse_opaque(params: object, want: str | None = None) -> ChannelConfig | DaemonConfig:
    """The opaque parameters as their model. `want`: the kind the caller needs (OPAQUE_KIND or
    DAEMON_OPAQUE_KIND); another kind is refused too."""
    if not isinstance(params, Mapping):
        raise OpaqueConfigError(
            f"invalid opaque configuration: expected an object, got {type(params).__name__}"
        )
    kind = params.get("kind")
    model = _KINDS.get(str(kind))
    if model is None or (want is not None and kind != want):
        expected = want or " or ".join(_KINDS)
        raise OpaqueConfigError(f"invalid opaque configuration: kind: {kind!r}, want {expected}")
    return model.validated(params)
