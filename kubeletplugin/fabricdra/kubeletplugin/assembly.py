"""A discovery pass's records assembled into the devices this node offers: the one assembly the
agent, `fabricdra inventory` and the tests share (issue 31 point 4).

Above the model (`devices.py`) and the kinds (`kinds/`): the kinds build on the model, this
module builds on the kinds, so neither imports the other in a circle
(tests/unit/test_import_graph.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from fabricdra.api.inventory import Accelerator, Interface

from .devices import DeviceConfig, DeviceInventory, GpuHealth, GpuInfo, HeldAs, gpu_info
from .discovery.node import Discovery
from .discovery.nvml import NvmlReadings
from .discovery.sysfs import SysfsTree
from .kinds import KINDS, BuildInputs, kind_of

DEFAULTS = DeviceConfig()  # frozen: one shared default is safe


def build_devices(
    interfaces: Sequence[Interface],
    accelerators: Sequence[Accelerator],
    config: DeviceConfig = DEFAULTS,
    gpu_health: Mapping[str, GpuHealth] | None = None,
    gpu_info: Mapping[str, GpuInfo] | None = None,
    lost: Sequence[Accelerator] = (),
    held: Mapping[str, HeldAs] | None = None,
    created_mig: Collection[str] = (),
    sysfs: SysfsTree | None = None,
) -> DeviceInventory:
    """Every device this node offers, sorted by name (a stable order for slices and diffs):
    each kind of the registry (kinds/) builds its own from this pass's records.
    `lost`: GPUs seen earlier that have left the PCI bus (`lost_accelerators`): offered from
    their last record, Unhealthy, marked `lost`. `held`: RDMA device names prepared claims
    hold, and how (`held_endpoints`); offered so. `created_mig`: UUIDs of the MIG instances
    dynamic MIG created for claims (dynamicmig.py's journal): offered under their placement's
    name, the device the claim was allocated, not adopted as static. `sysfs`: this pass's
    tree, for kinds that read records of their own (None: those offer nothing)."""
    inputs = BuildInputs(
        interfaces=interfaces,
        accelerators=accelerators,
        config=config,
        gpu_health=gpu_health or {},
        gpu_info=gpu_info or {},
        lost=lost,
        held=held or {},
        created_mig=created_mig,
        sysfs=sysfs,
    )
    out = [d for kind in KINDS for d in kind.build(inputs)]
    out.sort(key=lambda d: d.name)
    holder_sets = frozenset(d.name for d in out if kind_of(d).holders(d))
    return DeviceInventory(
        tuple(out), shared_holders=config.rdma_shared_holders, holder_sets=holder_sets
    )


def assemble(
    discovery: Discovery,
    config: DeviceConfig,
    sysfs: SysfsTree | None,
    *,
    nvml: NvmlReadings | None = None,
    gpu_health: Mapping[str, GpuHealth] | None = None,
    lost: Sequence[Accelerator] = (),
    held: Mapping[str, HeldAs] | None = None,
    created_mig: Collection[str] = (),
) -> DeviceInventory:
    """The devices one discovery pass offers under the node's `config`: what the agent
    publishes and `fabricdra inventory --node-name` previews. `sysfs`: the pass's tree (kinds
    that read records of their own, EFA, read it); `nvml`: the pass's NVML readings with the
    Xids seen applied (default: the discovery's own); the rest as `build_devices` says (the
    agent's state: a one-shot preview has none). A part whose enumeration failed offers
    nothing of that part."""
    return build_devices(
        discovery.interfaces or [],
        discovery.accelerators or [],
        config,
        gpu_health,
        gpu_info(nvml if nvml is not None else discovery.nvml),
        lost=lost,
        held=held,
        created_mig=created_mig,
        sysfs=sysfs,
    )
