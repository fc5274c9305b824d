"""The network status of granted RDMA netdevs: addresses read over rtnetlink from a real
kernel in a network namespace of the test's own (entered as the agent enters the host's), and
the hardware address from a kernel-shaped sysfs tree."""

from __future__ import annotations

from pathlib import Path

from fabricdra.kubeletplugin.networkstatus import (
    Address,
    dump_addresses,
    host_addresses,
    network_data,
)
from tests.netns import IsolatedNetns
from tests.sysfs.builder import SysfsBuilder


def test_the_kernel_answers_for_this_namespace() -> None:
    lo = {a.cidr: a.scope for a in dump_addresses() if a.interface == "lo"}
    assert lo.get("127.0.0.1/8") == 254  # host scope


def test_the_host_namespace_is_entered_to_read_its_addresses(tmp_path: Path) -> None:
    wanted = {"ens0np0": ["192.0.2.10/24", "2001:db8::10/64"], "ens1np0": ["198.51.100.7/25"]}
    with IsolatedNetns(tmp_path, wanted) as ns:
        found = host_addresses(ns.proc_root)
    assert found is not None
    by_name: dict[str, set[str]] = {}
    for a in found:
        if a.scope == 0:
            by_name.setdefault(a.interface, set()).add(a.cidr)
    assert by_name == {k: set(v) for k, v in wanted.items()}
    # Not the test's own namespace: none of its interfaces but loopback exist there.
    assert {a.interface for a in found} <= {"lo", "ens0np0", "ens1np0", "peer0", "peer1"}


def test_a_namespace_that_cannot_be_read_gives_no_addresses(tmp_path: Path) -> None:
    assert host_addresses(tmp_path / "no-proc") is None


def test_network_data_keeps_global_addresses_of_the_interface_and_its_mac(
    tmp_path: Path,
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    b.netdev("ens0np0", None)
    b.write("class/net/ens0np0/address", "b8:3f:d2:00:00:01\n")
    addresses = [
        Address("ens0np0", "192.0.2.10/24", 0),
        Address("ens0np0", "fe80::1/64", 253),  # link-local: says nothing off the node
        Address("ens0np0", "192.0.2.10/24", 0),  # listed twice: the API wants them unique
        Address("ens1np0", "198.51.100.7/25", 0),  # another interface
        *(Address("ens0np0", f"10.0.0.{i}/8", 0) for i in range(1, 21)),
    ]
    data = network_data("ens0np0", b.root, addresses)
    assert data["interfaceName"] == "ens0np0"
    assert data["hardwareAddress"] == "b8:3f:d2:00:00:01"
    assert data["ips"][:2] == ["192.0.2.10/24", "10.0.0.1/8"]
    assert len(data["ips"]) == 16  # the API's limit
    # Addresses unknown: no ips at all (an empty list would say "none"); no MAC file: none.
    b.netdev("ens1np0", None)
    assert network_data("ens1np0", b.root, None) == {"interfaceName": "ens1np0"}
