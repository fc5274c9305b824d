"""A held-out DGX SuperPOD-style compute fabric: scalable unit 1 (32 nodes x 8 compute rails,
one QM9700 leaf per rail), a partly built SU 2 (4 nodes), four spines every leaf is cabled to,
and two cores above them; each node also has a storage NIC on a storage leaf (another fabric).
The layout follows NVIDIA's DGX SuperPOD H100 reference architecture (rail-optimised: NIC i of
every node of an SU on leaf i of the SU; https://docs.nvidia.com/dgx-superpod/
reference-architecture-scalable-infrastructure-h100/latest/network-fabrics.html).

Mis-cabled on purpose (what the cabling check must find, by name):
- dgx009: the rail-2 and rail-3 cables swapped (NIC 2 on leaf 3, NIC 3 on leaf 2);
- dgx010: the rail-6 cable on the rail-7 leaf (two NICs on leaf 7);
- dgx011: the rail-4 cable on SU 2's rail-4 leaf (another block's leaf);
- dgx017: its storage NIC on SU 1's rail-5 leaf (a storage NIC on a compute leaf).

`dump()` writes the fabric as ibnetdiscover prints it (rdma-core infiniband-diags/
ibnetdiscover.c: out_switch, out_switch_port, out_ca, out_ca_port); `records()` the NodeDevices
objects the node agents would publish for it. superpod-su.ibnetdiscover is dump()'s output,
recorded (regenerate: python -m tests.fabrics.superpod > tests/fabrics/superpod-su.ibnetdiscover).
"""

from __future__ import annotations

from typing import Any

SU_NODES = {1: list(range(1, 33)), 2: list(range(33, 37))}
RAILS = 8
SPINES = 4
CORES = 2
# DGX H100's compute netdevs, rail order (NIC i is the one next to GPU i).
NETDEVS = [
    "ibp24s0",
    "ibp64s0",
    "ibp79s0",
    "ibp94s0",
    "ibp154s0",
    "ibp192s0",
    "ibp206s0",
    "ibp220s0",
]
STORAGE_NETDEV = "ibp41s0f0"
STORAGE_RDMA = "mlx5_8"


def node_name(n: int) -> str:
    return f"dgx{n:03d}"


def su_of(n: int) -> int:
    return next(su for su, nodes in SU_NODES.items() if n in nodes)


def leaf(su: int, rail: int) -> int:
    return 0xB8599F0300A00000 + (su << 8) + rail


def spine(s: int) -> int:
    return 0xB8599F0300B00000 + s


def core(c: int) -> int:
    return 0xB8599F0300C00000 + c


def storage_leaf(n: int) -> int:
    return 0xB8599F0300D00000 + (n - 1) // 16


def ca_node(n: int, nic: int) -> int:
    return 0x0C42A10300000000 + (n << 8) + (nic << 4)


def ca_port(n: int, nic: int) -> int:
    return ca_node(n, nic) + 1


def cabling() -> dict[tuple[int, int], int]:
    """(node, nic) -> the leaf it is actually cabled to; nic 8 is the storage NIC."""
    out: dict[tuple[int, int], int] = {}
    for su, nodes in SU_NODES.items():
        for n in nodes:
            for r in range(RAILS):
                out[(n, r)] = leaf(su, r)
            out[(n, 8)] = storage_leaf(n)
    out[(9, 2)], out[(9, 3)] = leaf(1, 3), leaf(1, 2)
    out[(10, 6)] = leaf(1, 7)
    out[(11, 4)] = leaf(2, 4)
    out[(17, 8)] = leaf(1, 5)
    return out


def _leaf_port(n: int, nic: int) -> int:
    """Node k of an SU on leaf port k (1-32); the one storage NIC cabled to a compute leaf
    (dgx017's) on port 60, an unused one."""
    return 60 if nic == 8 else SU_NODES[su_of(n)].index(n) + 1


def _leaf_desc(sw: int) -> str:
    if sw >> 20 == 0xB8599F0300D:
        return f"MF0;storage-leaf{sw & 0xFF}:MQM9700/U1"
    return f"MF0;su{(sw >> 8) & 0xFF}-leaf-r{sw & 0xFF}:MQM9700/U1"


def dump() -> str:
    """The compute fabric (the storage leaves are another subnet, not in this dump)."""
    cab = cabling()
    lines = [
        "#",
        "# Topology file: generated on Mon Dec  7 03:00:00 2026",
        "#",
        "# Initiated from node 0c42a10300000100 port 0c42a10300000101",
        "",
    ]
    lids = iter(range(1, 10000))
    sw_lid: dict[int, int] = {}
    leaves = [leaf(su, r) for su in SU_NODES for r in range(RAILS)]
    spines = [spine(s) for s in range(SPINES)]
    cores = [core(c) for c in range(CORES)]
    for sw in leaves + spines + cores:
        sw_lid[sw] = next(lids)
    ca_lid = {key: next(lids) for key in sorted(cab) if cab[key] in sw_lid}

    def sw_desc(sw: int) -> str:
        if sw in spines:
            return f"MF0;spine{spines.index(sw)}:MQM9700/U1"
        if sw in cores:
            return f"MF0;core{cores.index(sw)}:MQM9700/U1"
        return _leaf_desc(sw)

    def switch_block(sw: int, ports: list[tuple[int, str]]) -> None:
        lines.extend(["vendid=0x2c9", "devid=0xd2f0", f"sysimgguid=0x{sw:x}"])
        lines.append(f"switchguid=0x{sw:x}({sw:x})")
        lines.append(
            f'Switch\t65 "S-{sw:016x}"\t\t# "{sw_desc(sw)}" enhanced port 0 lid {sw_lid[sw]} lmc 0'
        )
        lines.extend(p for _, p in sorted(ports))
        lines.append("")

    for sw in leaves:
        ports = []
        for (n, nic), to in sorted(cab.items()):
            if to != sw:
                continue
            port = _leaf_port(n, nic)
            ports.append(
                (
                    port,
                    f'[{port}]\t"H-{ca_node(n, nic):016x}"[1]({ca_port(n, nic):x}) '
                    f'\t\t# "{node_name(n)} mlx5_{nic}" lid {ca_lid[(n, nic)]} 4xNDR',
                )
            )
        for i, sp in enumerate(spines):
            port = 33 + i
            ports.append(
                (
                    port,
                    f'[{port}]\t"S-{sp:016x}"[{leaves.index(sw) + 1}]\t\t# '
                    f'"{sw_desc(sp)}" lid {sw_lid[sp]} 4xNDR',
                )
            )
        switch_block(sw, ports)
    for i, sp in enumerate(spines):
        ports = []
        for j, lf in enumerate(leaves):
            ports.append(
                (
                    j + 1,
                    f'[{j + 1}]\t"S-{lf:016x}"[{33 + i}]\t\t# "{sw_desc(lf)}" lid '
                    f"{sw_lid[lf]} 4xNDR",
                )
            )
        for k, co in enumerate(cores):
            port = 49 + k
            ports.append(
                (
                    port,
                    f'[{port}]\t"S-{co:016x}"[{i + 1}]\t\t# "{sw_desc(co)}" lid {sw_lid[co]} 4xNDR',
                )
            )
        switch_block(sp, ports)
    for k, co in enumerate(cores):
        ports = [
            (
                i + 1,
                f'[{i + 1}]\t"S-{sp:016x}"[{49 + k}]\t\t# "{sw_desc(sp)}" lid {sw_lid[sp]} 4xNDR',
            )
            for i, sp in enumerate(spines)
        ]
        switch_block(co, ports)
    for (n, nic), to in sorted(cab.items()):
        if to not in sw_lid:
            continue
        port = _leaf_port(n, nic)
        lines.extend(["vendid=0x2c9", "devid=0x1021", f"sysimgguid=0x{ca_node(n, nic):x}"])
        lines.append(f"caguid=0x{ca_node(n, nic):x}")
        lines.append(f'Ca\t1 "H-{ca_node(n, nic):016x}"\t\t# "{node_name(n)} mlx5_{nic}"')
        lines.append(
            f'[1]({ca_port(n, nic):x}) \t"S-{to:016x}"[{port}]\t\t# lid {ca_lid[(n, nic)]} '
            f'lmc 0 "{sw_desc(to)}" lid {sw_lid[to]} 4xNDR'
        )
        lines.append("")
    return "\n".join(lines)


def records(*, smp_su2: bool = False) -> dict[str, dict[str, Any]]:
    """Node -> its NodeDevices object as the agent publishes it: every NIC with its port GUID,
    rail and role; the measured neighbour (an SMP query of the peer) on SU 1's nodes. SU 2's
    agents could not query their peers (`smp_su2` False): their leaves come from the dump."""
    cab = cabling()
    out: dict[str, dict[str, Any]] = {}
    for su, nodes in SU_NODES.items():
        for n in nodes:
            interfaces = []
            for nic in range(RAILS + 1):
                storage = nic == 8
                so: dict[str, Any] = {
                    "portGuid": f"0x{ca_port(n, nic):016x}",
                    "rail": None if storage else nic,
                    "railSource": None if storage else "measured",
                    "role": "storage" if storage else "compute",
                    "roleSource": "gpu-distance",
                }
                if su == 1 or smp_su2:
                    so["neighbour"] = {
                        "switch": f"0x{cab[(n, nic)]:016x}",
                        "port": "1",
                        "name": _leaf_desc(cab[(n, nic)]),
                        "source": "measured",
                        "via": "smp",
                    }
                interfaces.append(
                    {
                        "name": STORAGE_NETDEV if storage else NETDEVS[nic],
                        "rdma": True,
                        "rdmaDevice": STORAGE_RDMA if storage else f"mlx5_{nic}",
                        "scaleOut": so,
                    }
                )
            out[node_name(n)] = {
                "metadata": {"name": node_name(n)},
                "spec": {"interfaces": interfaces},
            }
    return out


if __name__ == "__main__":
    print(dump())
