"""Never hand out a device twice (issue 30 point 1): a device plugin advertising a group on the
Node's capacity, or an RDMA subsystem in exclusive network-namespace mode, withholds that group
of this node's devices (coexistence.py); the RDMA namespace mode is read from the kernel's
`ib_core` module parameter in a kernel-shaped sysfs tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fabricdra.cli.common import UsageError
from fabricdra.kubeletplugin.assembly import assemble, build_devices
from fabricdra.kubeletplugin.coexistence import (
    BUILTIN_RULES,
    GROUPS,
    NETNS_MODE_PARAM,
    Conflict,
    Rule,
    device_plugin_conflicts,
    netns_conflicts,
    parse_rule,
    read_netns_mode,
    withhold,
)
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds import KINDS
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import amd_mi300x, discover_at, gaudi_node, h100_snapshot, hgx_h100


def _node(capacity: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "64", **capacity}}}


def _hgx(root: Path, vf_nics: tuple[int, ...] = ()) -> DeviceInventory:
    b = SysfsBuilder(root)
    hgx = hgx_h100(b, vf_nics=vf_nics)
    d = discover_at(b.root, h100_snapshot(hgx.gpus))
    return build_devices(d.interfaces or [], d.accelerators or [])


def test_nvidias_device_plugin_on_the_node_withholds_the_gpus_not_the_nics(
    tmp_path: Path,
) -> None:
    inventory = _hgx(tmp_path / "sys")
    assert {d.type for d in inventory} == {"gpu", "rdma"}
    conflicts = device_plugin_conflicts(_node({"nvidia.com/gpu": "8"}), BUILTIN_RULES)
    assert conflicts == [Conflict("nvidia-gpu", "device plugin resource nvidia.com/gpu=8")]
    kept, dropped = withhold(inventory, conflicts)
    assert {d.type for d in kept} == {"rdma"}
    assert len(dropped["nvidia-gpu"]) == 8
    assert set(dropped) == {"nvidia-gpu"}


@pytest.mark.parametrize(
    ("capacity", "groups"),
    [
        ({"nvidia.com/gpu": "0"}, set()),  # a plugin that has gone: kubelet keeps it at 0
        ({"nvidia.com/mig-1g.10gb": "7"}, {"nvidia-gpu"}),  # MIG strategy mixed
        ({"nvidia.com/gpu.shared": "32"}, {"nvidia-gpu"}),  # time-slicing, renamed
        ({"rdma/rdma_shared_device_a": "1000"}, {"rdma"}),  # the Network Operator's plugin
        ({"vpc.amazonaws.com/efa": "32"}, {"efa"}),
        ({"amd.com/gpu": "8"}, {"amd-gpu"}),
        ({"habana.ai/gaudi": "8"}, {"gaudi"}),  # Intel's Gaudi device plugin
        ({"example.com/foo": "3", "memory": "512Gi"}, set()),
    ],
)
def test_the_built_in_names_of_the_ecosystems_device_plugins(
    capacity: dict[str, str], groups: set[str]
) -> None:
    found = device_plugin_conflicts(_node(capacity), BUILTIN_RULES)
    assert {c.group for c in found} == groups


def test_an_sriov_pool_is_named_by_the_operator(tmp_path: Path) -> None:
    inventory = _hgx(tmp_path / "sys", vf_nics=(0,))
    node = _node({"nvidia.com/sriov_rdma_vf": "8"})
    assert device_plugin_conflicts(node, BUILTIN_RULES) == []  # its name is the operator's
    rules = (*BUILTIN_RULES, parse_rule("rdma=nvidia.com/sriov_rdma_vf"))
    conflicts = device_plugin_conflicts(node, rules)
    assert [c.group for c in conflicts] == ["rdma"]
    kept, _ = withhold(inventory, conflicts)
    assert {d.type for d in kept} == {"gpu"}  # VFs and PFs alike: one group
    assert parse_rule("rdma=intel.com/*") == Rule("rdma", "intel.com/*")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("nvidia.com/sriov_rdma_vf", "is not GROUP=RESOURCE"),
        ("rdma=", "is not GROUP=RESOURCE"),
        ("nic=nvidia.com/x", "group 'nic' is not one of nvidia-gpu, amd-gpu, rdma, efa, gaudi"),
        ("rdma=sriov_rdma_vf", "'sriov_rdma_vf' is not a resource name"),
    ],
)
def test_a_bad_rule_is_refused_naming_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_rule(text)


def test_the_cli_flag_adds_rules_and_refuses_bad_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_cli_kubelet_plugin import _config

    monkeypatch.delenv("FABRICDRA_DEVICE_PLUGIN_RESOURCES", raising=False)
    assert _config().device_plugin_rules == BUILTIN_RULES  # type: ignore[attr-defined]
    rules = _config("--device-plugin-resource", "rdma=nvidia.com/sriov_rdma_vf")
    assert rules.device_plugin_rules[-1] == Rule("rdma", "nvidia.com/sriov_rdma_vf")  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="group 'gpu' is not one of"):
        _config("--device-plugin-resource", "gpu=nvidia.com/gpu")


def test_amd_gpus_are_their_own_group(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    amd_mi300x(b, amdgpu=True)
    d = discover_at(b.root)
    inventory = build_devices(d.interfaces or [], d.accelerators or [])
    assert any(dev.type == "gpu" for dev in inventory)
    nvidia = device_plugin_conflicts(_node({"nvidia.com/gpu": "8"}), BUILTIN_RULES)
    assert withhold(inventory, nvidia) == (inventory, {})  # nothing of theirs here
    amd = device_plugin_conflicts(_node({"amd.com/gpu": "8"}), BUILTIN_RULES)
    kept, dropped = withhold(inventory, amd)
    assert not any(dev.type == "gpu" for dev in kept)
    assert set(dropped) == {"amd-gpu"}


def test_every_kind_names_its_group_and_its_names_are_valid_rules() -> None:
    """The table comes from the kinds (kinds/base.py `plugin_group`): each kind's built-in
    names are rules an operator could have written, and no kind is left without a group."""
    assert all(k.plugin_group is not None for k in KINDS)
    assert all(parse_rule(f"{r.group}={r.resource}") == r for r in BUILTIN_RULES)
    assert {r.group for r in BUILTIN_RULES} == set(GROUPS)


def test_gaudis_are_their_own_group(tmp_path: Path) -> None:
    """Intel's Gaudi device plugin advertises `habana.ai/gaudi`: with it on the Node, the
    Gaudis (`--gaudi`) are withheld and nothing else."""
    b = SysfsBuilder(tmp_path / "sys")
    gaudi_node(b, gaudis=2, ports=1)
    inventory = assemble(discover_at(b.root), DeviceConfig(gaudi=True), SysfsTree(b.root))
    assert {dev.type for dev in inventory} >= {"gaudi"}
    habana = device_plugin_conflicts(_node({"habana.ai/gaudi": "2"}), BUILTIN_RULES)
    kept, dropped = withhold(inventory, habana)
    assert not any(dev.type == "gaudi" for dev in kept)
    assert set(dropped) == {"gaudi"}
    assert len(dropped["gaudi"]) == 2
    nvidia = device_plugin_conflicts(_node({"nvidia.com/gpu": "8"}), BUILTIN_RULES)
    assert withhold(inventory, nvidia) == (inventory, {})


# -- the RDMA subsystem's network-namespace mode ------------------------------------------


@pytest.mark.parametrize(("value", "mode"), [("Y", "shared"), ("N", "exclusive")])
def test_the_netns_mode_is_read_from_ib_cores_module_parameter(
    tmp_path: Path, value: str, mode: str
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    b.write(NETNS_MODE_PARAM, value + "\n")
    tree = SysfsTree(b.root)
    try:
        assert read_netns_mode(tree) == mode
    finally:
        tree.close()


def test_no_ib_core_is_no_mode_and_a_nonsense_reading_is_an_error(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    b.write("module/other/parameters/x", "1")
    tree = SysfsTree(b.root)
    try:
        assert read_netns_mode(tree) is None
        b.write(NETNS_MODE_PARAM, "maybe")
        with pytest.raises(ValueError, match="reads 'maybe', not Y or N"):
            read_netns_mode(tree)
    finally:
        tree.close()


def test_exclusive_netns_mode_withholds_rdma_and_efa_not_gpus(tmp_path: Path) -> None:
    inventory = _hgx(tmp_path / "sys")
    assert netns_conflicts("shared") == netns_conflicts(None) == []
    kept, dropped = withhold(inventory, netns_conflicts("exclusive"))
    assert {d.type for d in kept} == {"gpu"}
    assert set(dropped) == {"rdma"}


def test_the_agent_withholds_with_a_netns_reading_from_the_hosts_sysfs(tmp_path: Path) -> None:
    """The whole pass, offline (no API: no Node to read): exclusive mode in the host's sysfs
    takes the NICs out of what is published and what prepare resolves; shared puts them
    back."""
    from fabricdra.kubeletplugin.agent import Agent
    from tests.unit.agentkit import offline_config
    from tests.unit.test_xid_events import Captured

    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    b.write(NETNS_MODE_PARAM, "N\n")
    (tmp_path / "nvml.json").write_text(json.dumps(h100_snapshot(hgx.gpus)))
    config = offline_config(tmp_path, b.root, nvml_snapshot=tmp_path / "nvml.json")
    agent = Agent(config, None, publisher=Captured())
    try:
        assert {d.type for d in agent.pass_once()} == {"gpu"}
        assert len(agent.withheld["rdma"]) == 8
        assert agent.inventory.get(agent.withheld["rdma"][0]) is None  # prepare refuses it
        b.write(NETNS_MODE_PARAM, "Y\n")
        assert {d.type for d in agent.pass_once()} == {"gpu", "rdma"}
        assert agent.withheld == {}
    finally:
        agent.families.nvidia.xids.close()
