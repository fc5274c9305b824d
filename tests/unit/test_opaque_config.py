"""The opaque configuration the ComputeDomain controller writes and the compute-domain node plugin
reads (fabricdra.api.opaque): one model, validated on both sides with the same message."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.opaque import (
    ChannelConfig,
    DaemonConfig,
    OpaqueConfigError,
    parse_opaque,
)
from fabricdra.controller import objects
from fabricdra.controller.claims import channel_of
from fabricdra.kube.rest import CLAIMS
from fabricdra.kubeletplugin.kubelet import ClaimRef, PrepareError
from tests.unit.test_computedomain_driver import NODE, NS, FakeApi, make_driver

UID = "5e1f3c1a-0b8e-4d39-9a57-2f0c1e7d2b11"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    a = FakeApi()
    yield a
    a.close()


def _domain(uid: str = UID, name: str = "train") -> ComputeDomain:
    return ComputeDomain.model_validate(
        {
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "train-channel"}}},
        }
    )


def _put_claim(api: FakeApi, name: str, device: str, params: dict[str, Any]) -> ClaimRef:
    """An allocated claim on NODE whose one compute-domain device carries `params`."""
    api.docs[CLAIMS.path(NS, name)] = {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": cd.DRIVER, "pool": NODE, "device": device, "request": device}
                    ],
                    "config": [{"opaque": {"driver": cd.DRIVER, "parameters": params}}],
                }
            }
        },
    }
    return ClaimRef(NS, name, f"uid-{name}")


def test_the_writer_and_the_reader_refuse_a_bad_channel_with_one_message(
    tmp_path: Path, api: FakeApi
) -> None:
    # Controller side, where written: a channel outside the host's range never reaches a claim.
    with pytest.raises(OpaqueConfigError) as written:
        objects.channel_config(_domain(), cd.CHANNEL_COUNT)
    message = str(written.value)
    assert message.startswith(f"invalid {cd.OPAQUE_KIND}: channel: ")
    # Node side, where read: the same configuration in a claim is refused at prepare.
    params = {**objects.channel_config(_domain(), 0), "channel": cd.CHANNEL_COUNT}
    claim = _put_claim(api, "bad-channel", cd.CHANNEL_DEVICE, params)
    with pytest.raises(PrepareError) as read:
        make_driver(tmp_path, api).prepare(claim)
    assert message in str(read.value)


def test_a_daemon_config_whose_domain_uid_climbs_out_of_its_folder_is_refused(
    tmp_path: Path, api: FakeApi
) -> None:
    # The daemon's host folder is <plugin_dir>/domains/<domainUID>: a UID is never a path.
    params = objects.daemon_config(_domain())
    params["domainUID"] = "../../../etc"
    claim = _put_claim(api, "climb", cd.DAEMON_DEVICE, params)
    with pytest.raises(PrepareError, match=f"invalid {cd.DAEMON_OPAQUE_KIND}: domainUID: "):
        make_driver(tmp_path, api).prepare(claim)
    assert not (tmp_path / "etc").exists()
    with pytest.raises(OpaqueConfigError, match="domainUID"):
        objects.daemon_config(_domain(uid="../../../etc"))


def test_every_bad_field_is_named() -> None:
    with pytest.raises(OpaqueConfigError) as e:
        parse_opaque(
            {
                "kind": cd.OPAQUE_KIND,
                "domainUID": UID,
                "domainName": "Not_A_Name",
                "namespace": NS,
                "channel": "seven",
                "imexMode": "shared",
            }
        )
    named = set(re.findall(r"(?:: |; )(\w+): ", str(e.value)))
    assert named == {"domainName", "channel", "imexMode"}


def test_the_kind_decides_the_model_and_a_wrong_kind_is_refused() -> None:
    assert isinstance(parse_opaque(objects.channel_config(_domain(), 3)), ChannelConfig)
    assert isinstance(parse_opaque(objects.daemon_config(_domain())), DaemonConfig)
    with pytest.raises(OpaqueConfigError, match="kind: 'ComputeDomainDaemonConfig'"):
        parse_opaque(objects.daemon_config(_domain()), cd.OPAQUE_KIND)
    with pytest.raises(OpaqueConfigError, match="expected an object"):
        parse_opaque(["not", "an", "object"])


def test_a_config_from_an_older_or_newer_writer_still_reads() -> None:
    # Claims outlive upgrades: fields left out get the defaults older controllers implied,
    # fields a newer controller adds are ignored.
    old = {"kind": cd.OPAQUE_KIND, "domainUID": UID, "domainName": "t", "namespace": NS}
    config = parse_opaque({**old, "channel": 4, "addedLater": True})
    assert isinstance(config, ChannelConfig)
    assert (config.channel, config.allocationMode, config.imexMode) == (4, "Single", "managed")
    assert config.apiVersion == cd.API_VERSION


def test_the_written_parameters_are_sorted_and_complete() -> None:
    params = objects.channel_config(_domain(), 9)
    assert list(params) == sorted(params)
    assert params == {
        "allocationMode": "Single",
        "apiVersion": cd.API_VERSION,
        "channel": 9,
        "domainName": "train",
        "domainUID": UID,
        "imexMode": "managed",
        "kind": cd.OPAQUE_KIND,
        "namespace": NS,
    }


def _allocated_claim(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": NS},
        "spec": {"devices": {"config": [{"opaque": {"driver": cd.DRIVER, "parameters": params}}]}},
        "status": {"allocation": {"devices": {"results": [{"driver": cd.DRIVER, "pool": NODE}]}}},
    }


def test_the_controller_reads_claims_through_the_model() -> None:
    good = objects.channel_config(_domain(), 12)
    assert channel_of(_allocated_claim(good)) == 12
    # Refused by the node plugin, so no workload can use the channel it names: it holds none.
    assert channel_of(_allocated_claim({**good, "domainUID": "a/b"})) is None
    assert channel_of(_allocated_claim({**good, "channel": -1})) is None
