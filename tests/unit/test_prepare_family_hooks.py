"""Prepare reaches device families only through their per-claim hooks (kinds/family.py
`ClaimHooks`, issue 31 point 2): a family prepare.py has never heard of is lent to, begun,
undone, released and handed its opaque configuration the way NVIDIA's is."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fabricdra.kubeletplugin.devices import Device
from fabricdra.kubeletplugin.kinds import PrepareContext
from fabricdra.kubeletplugin.kinds.family import OpaqueConfigs, Undo
from fabricdra.kubeletplugin.kubelet import PrepareError
from fabricdra.kubeletplugin.kubelet.cdi import ContainerEdits
from tests.integration.kubelethost import Host, build_host
from tests.unit.test_prepare import DRIVER, GPU0, NIC0, NS, Node, kubelet_ids


@dataclass(frozen=True)
class Setting:
    value: str

    def edits(self, devices: int) -> ContainerEdits:
        return ContainerEdits(env=(f"TEST_SETTING={self.value}x{devices}",))


@dataclass
class RecordedConfigs:
    checked: list[str] = field(default_factory=list)

    def parse(self, params: object) -> Setting | None:
        assert isinstance(params, dict)
        if params.get("kind") != "TestConfig":
            raise PrepareError(f"not a TestConfig: {params.get('kind')!r}")
        return Setting(str(params["value"])) if "value" in params else None

    def check(self, device: Device, name: str, request: str) -> None:
        self.checked.append(name)


@dataclass
class Recording:
    """A family that records each hook prepare calls."""

    name: str = "recording"
    opaque: OpaqueConfigs | None = None
    refuse_in_lend: bool = False
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def lend(self, ctx: PrepareContext) -> PrepareContext:
        self.calls.append(("lend", ctx.claim_uid))
        if self.refuse_in_lend:
            raise PrepareError("refused by the recording family")
        return ctx

    def begin(self, claim_uid: str, devices: Sequence[Device]) -> Undo:
        self.calls.append(("begin", claim_uid, tuple(d.name for d in devices)))
        return lambda: self.calls.append(("undo", claim_uid))

    @contextmanager
    def serving(self) -> Iterator[None]:
        self.calls.append(("serving",))
        yield
        self.calls.append(("served",))

    def release(self, claim_uid: str, devices: Sequence[str] | None) -> None:
        self.calls.append(("release", claim_uid, None if devices is None else tuple(devices)))


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("hgx"), mig_gpu=7)


def _node(tmp_path: Path, hgx: Host, family: Recording, first: bool = False) -> Node:
    node = Node(tmp_path, hgx)
    others = tuple(node.driver.families)
    node.driver.families = (family, *others) if first else (*others, family)
    return node


def test_prepare_and_unprepare_call_each_familys_hooks(tmp_path: Path, hgx: Host) -> None:
    family = Recording()
    node = _node(tmp_path, hgx, family)
    claim = node.claims.add(
        "both", [{"request": "gpu", "device": GPU0}, {"request": "nic", "device": NIC0}]
    )
    node.prepare(claim)
    assert family.calls == [
        ("begin", claim.uid, (GPU0, NIC0)),
        ("serving",),
        ("lend", claim.uid),
        ("served",),
    ]
    family.calls.clear()
    node.driver.unprepare(claim)
    assert family.calls == [("release", claim.uid, (GPU0, NIC0))]
    family.calls.clear()
    node.driver.unprepare(claim)  # no checkpoint entry any more
    assert family.calls == [("release", claim.uid, None)]


def test_a_failure_after_begin_calls_the_undo_and_leaves_nothing(tmp_path: Path, hgx: Host) -> None:
    family = Recording(refuse_in_lend=True)
    node = _node(tmp_path, hgx, family)
    claim = node.claims.add("gpu", [{"request": "gpu", "device": GPU0}])
    with pytest.raises(PrepareError, match="refused by the recording family"):
        node.prepare(claim)
    assert family.calls[0] == ("begin", claim.uid, (GPU0,))
    assert family.calls[-1] == ("undo", claim.uid)
    assert node.driver.checkpoint.get(claim.uid) is None
    assert not node.driver.cdi.path_for(claim.uid).exists()


def _with_config(node: Node, name: str, params: dict[str, Any]) -> None:
    devices = node.claims.objs[(NS, name)]["status"]["allocation"]["devices"]
    devices["config"] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER, "parameters": params},
        }
    ]


def test_opaque_configuration_goes_to_the_family_that_takes_it(tmp_path: Path, hgx: Host) -> None:
    configs = RecordedConfigs()
    node = _node(tmp_path, hgx, Recording(opaque=configs), first=True)
    claim = node.claims.add("gpu", [{"request": "gpu", "device": GPU0}])
    _with_config(node, "gpu", {"kind": "TestConfig", "value": "on"})
    ids = kubelet_ids(node.prepare(claim))
    assert configs.checked == [GPU0]
    assert node.cdi().env_values(ids, "TEST_SETTING") == {"onx1"}
    # What the family refuses, prepare reports in its own words around the family's.
    other = node.claims.add("other", [{"request": "gpu", "device": GPU0}])
    _with_config(node, "other", {"kind": "GpuConfig"})
    with pytest.raises(PrepareError) as e:
        node.prepare(other)
    assert str(e.value) == (
        f"opaque configuration for driver {DRIVER} (source FromClaim, requests ['gpu']): "
        "not a TestConfig: 'GpuConfig'; fix or remove it from the claim or its DeviceClass"
    )


def test_without_a_family_that_takes_opaque_configuration_it_is_refused(
    tmp_path: Path, hgx: Host
) -> None:
    node = Node(tmp_path, hgx)
    node.driver.families = ()
    claim = node.claims.add("gpu", [{"request": "gpu", "device": GPU0}])
    _with_config(node, "gpu", {"kind": "TestConfig", "value": "on"})
    with pytest.raises(PrepareError, match="this driver takes no opaque configuration"):
        node.prepare(claim)
