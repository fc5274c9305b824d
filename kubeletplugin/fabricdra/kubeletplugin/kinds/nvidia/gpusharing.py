"""GPU sharing (`--gpu-shares`, docs/attributes.md "Shared GPUs"): what a shared GPU publishes,
what prepare checks a share against, and the sharing strategies a claim may configure.

Publishing (1.36 model, consumable capacity): a whole NVIDIA GPU is one device with
`allowMultipleAllocations: true` and two consumable capacities, each with a request policy:

* `memory` (the GPU's memory): a claim that asks none takes all of it (`default` = the
  whole), so a claim written for an unshared GPU still gets the GPU to itself; a claim that
  asks `capacity.requests.memory: 2Gi` takes 2Gi (rounded up to whole MiB) and leaves the rest.
* `shares` (`--gpu-shares` N): each claim takes one unless it asks more, so at most N claims
  share one GPU whatever their memory requests.

The scheduler keeps the sums within the totals; prepare checks them again from its checkpoint
(`over_capacity`), since the node is the last line of defence: a share whose consumed capacity
is over the device's total, or that would pass it beside the shares already prepared, is
refused. A share the scheduler recorded no consumed capacity for counts as the whole GPU.

Sharing strategies (opaque configuration `GpuConfig`, NVIDIA's GpuConfig with its API group
translated): `TimeSlicing` (the GPU's own scheduler interleaves the sharers' contexts; only the
`Default` interval, since fabricdra never changes a GPU's settings) and `MPS` (the container is
pointed at the node's MPS control daemon, with the per-client limits as `CUDA_MPS_*`
variables). Neither isolates memory or faults between sharers: docs/attributes.md says what
each gives and does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from ...devices import Device
from ...kubelet import PrepareError
from ...kubelet.cdi import ContainerEdits, Mount
from ..gpupayload import gpu_payload

MIB = 2**20
MEMORY, SHARES = "memory", "shares"

GPU_CONFIG_API_VERSION = "resource.fabricdra.io/v1beta1"
GPU_CONFIG_KIND = "GpuConfig"
# Where nvidia-cuda-mps-control -d keeps its pipes by default; the node's daemon is the
# operator's (docs/attributes.md).
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")


def limits(device: Device) -> dict[str, int]:
    """The consumable capacities of a shared GPU (memory in bytes, shares); {}: none."""
    p = gpu_payload(device)
    if p is None or p.shares <= 0 or p.accelerator.memoryMiB is None:
        return {}
    return {MEMORY: p.accelerator.memoryMiB * MIB, SHARES: p.shares}


def published_capacity(memory: str, shares: int) -> dict[str, Any]:
    """The `capacity` entries of a shared GPU (`memory` in canonical form, e.g. `81559Mi`)."""
    return {
        MEMORY: {
            "value": memory,
            "requestPolicy": {
                "default": memory,
                "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
            },
        },
        SHARES: {
            "value": str(shares),
            "requestPolicy": {
                "default": "1",
                "validRange": {"min": "1", "max": str(shares), "step": "1"},
            },
        },
    }


# --- quantities ----------------------------------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]?)$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    **{s: Decimal(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(text: object) -> int:
    """A Kubernetes quantity (`2Gi`, `1`, `1500m`) as a whole number, rounded up (the
    scheduler's rounding of a consumed capacity never goes down); ValueError otherwise."""
    m = _QUANTITY.match(str(text).strip())
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    try:
        number = Decimal(m.group(1))
        suffix = m.group(2)
        scale = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    except (InvalidOperation, KeyError, ValueError):
        raise ValueError(f"not a quantity: {text!r}") from None
    value = number * scale
    if value < 0:
        raise ValueError(f"negative quantity: {text!r}")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def consumed(result: Mapping[str, Any], device: Device) -> dict[str, int] | None:
    """What an allocation result of a shared GPU consumes (`consumedCapacity`), each capacity
    the device has; a capacity the result does not name counts whole (the API's default for
    an unset request policy); None: not a shared GPU. PrepareError for what cannot be read or
    is not this device's."""
    total = limits(device)
    if not total:
        return None
    raw = result.get("consumedCapacity") or {}
    if not isinstance(raw, Mapping):
        raise PrepareError(f"device {device.name}: consumedCapacity is not a map: {raw!r}")
    out = dict(total)
    for name, text in raw.items():
        if name not in total:
            raise PrepareError(
                f"device {device.name}: the allocation consumes {name} {text}, a capacity "
                f"this GPU does not offer (it offers {', '.join(sorted(total))})"
            )
        try:
            out[str(name)] = parse_quantity(text)
        except ValueError as e:
            raise PrepareError(f"device {device.name}: consumedCapacity {name}: {e}") from None
    return out


def describe(name: str, amount: int) -> str:
    return f"{amount // MIB}Mi" if name == MEMORY and amount % MIB == 0 else str(amount)


def over_capacity(
    device: Device, wanted: Mapping[str, int], held: Sequence[Mapping[str, int]]
) -> str | None:
    """Why `wanted` (one share of `device`) cannot be honoured beside the shares `held`
    already prepared on it; None: it fits."""
    total = limits(device)
    for name, limit in sorted(total.items()):
        ask = wanted.get(name, limit)
        if ask > limit:
            return (
                f"it consumes {name} {describe(name, ask)}, over the GPU's total "
                f"{describe(name, limit)}"
            )
        used = sum(h.get(name, limit) for h in held)
        if used + ask > limit:
            return (
                f"it consumes {name} {describe(name, ask)} and the {len(held)} share(s) "
                f"already prepared on it consume {describe(name, used)}, more than the GPU's "
                f"total {describe(name, limit)}"
            )
    return None


# --- sharing strategies --------------------------------------------------------------------

Strategy = Literal["TimeSlicing", "MPS"]


@dataclass(frozen=True, slots=True)
class Sharing:
    """One `GpuConfig`'s sharing settings."""

    strategy: Strategy
    interval: str = "Default"
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None  # bytes

    def edits(self, gpus: int) -> ContainerEdits:
        """What a container given `gpus` GPUs under this strategy gets."""
        if self.strategy == "TimeSlicing":
            return ContainerEdits()  # the GPU's own time slicing: nothing to hand over
        env = [f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIRECTORY}"]
        if self.active_thread_percentage is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={self.active_thread_percentage}")
        if self.pinned_memory_limit is not None:
            # Per device ordinal as the container sees its GPUs; whole MiB (MPS reads M).
            mib = -(-self.pinned_memory_limit // MIB)
            limit = ",".join(f"{i}={mib}M" for i in range(gpus))
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limit}")
        mount = Mount(MPS_PIPE_DIRECTORY, MPS_PIPE_DIRECTORY, ("rbind", "rw"))
        return ContainerEdits(env=tuple(env), mounts=(mount,))


def parse_gpu_config(params: object) -> Sharing | None:
    """A `GpuConfig` opaque configuration's sharing settings (None: it sets none);
    PrepareError naming what is wrong."""
    where = f"{GPU_CONFIG_KIND} ({GPU_CONFIG_API_VERSION})"
    if not isinstance(params, Mapping):
        raise PrepareError(f"opaque configuration: expected an object, got {params!r}")
    api, kind = params.get("apiVersion"), params.get("kind")
    if (api, kind) != (GPU_CONFIG_API_VERSION, GPU_CONFIG_KIND):
        raise PrepareError(
            f"opaque configuration apiVersion {api!r} kind {kind!r} is not understood: this "
            f"driver takes {where} only"
        )
    unknown = set(params) - {"apiVersion", "kind", "sharing"}
    if unknown:
        raise PrepareError(f"{where}: unknown fields {sorted(unknown)}")
    sharing = params.get("sharing")
    if sharing is None:
        return None
    if not isinstance(sharing, Mapping):
        raise PrepareError(f"{where}: sharing must be an object, not {sharing!r}")
    unknown = set(sharing) - {"strategy", "timeSlicingConfig", "mpsConfig"}
    if unknown:
        raise PrepareError(f"{where}: sharing: unknown fields {sorted(unknown)}")
    strategy = sharing.get("strategy")
    if strategy == "TimeSlicing":
        if sharing.get("mpsConfig") is not None:
            raise PrepareError(f"{where}: sharing.mpsConfig is set but strategy is TimeSlicing")
        return Sharing("TimeSlicing", interval=_interval(where, sharing.get("timeSlicingConfig")))
    if strategy == "MPS":
        if sharing.get("timeSlicingConfig") is not None:
            raise PrepareError(f"{where}: sharing.timeSlicingConfig is set but strategy is MPS")
        return _mps(where, sharing.get("mpsConfig") or {})
    raise PrepareError(f"{where}: sharing.strategy must be TimeSlicing or MPS, not {strategy!r}")


def _interval(where: str, config: object) -> str:
    if config is None:
        return "Default"
    if not isinstance(config, Mapping) or set(config) - {"interval"}:
        raise PrepareError(f"{where}: sharing.timeSlicingConfig takes only interval: {config!r}")
    interval = config.get("interval", "Default")
    if interval not in TIME_SLICE_INTERVALS:
        raise PrepareError(
            f"{where}: sharing.timeSlicingConfig.interval must be one of "
            f"{', '.join(TIME_SLICE_INTERVALS)}, not {interval!r}"
        )
    if interval != "Default":
        raise PrepareError(
            f"{where}: time-slice interval {interval} would change the GPU's compute policy "
            "for every process on it, and fabricdra never changes a GPU's settings: only "
            "interval Default (the driver's own time slice) is honoured"
        )
    return str(interval)


def _mps(where: str, config: object) -> Sharing:
    if not isinstance(config, Mapping):
        raise PrepareError(f"{where}: sharing.mpsConfig must be an object, not {config!r}")
    allowed = {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"}
    unknown = set(config) - allowed
    if unknown:
        raise PrepareError(
            f"{where}: sharing.mpsConfig: unsupported fields {sorted(unknown)} (fabricdra takes "
            f"{', '.join(sorted(allowed))})"
        )
    pct = config.get("defaultActiveThreadPercentage")
    whole = isinstance(pct, int) and not isinstance(pct, bool)
    if pct is not None and not (whole and 1 <= pct <= 100):
        raise PrepareError(
            f"{where}: sharing.mpsConfig.defaultActiveThreadPercentage must be an integer "
            f"1..100, not {pct!r}"
        )
    limit_text = config.get("defaultPinnedDeviceMemoryLimit")
    limit = None
    if limit_text is not None:
        try:
            limit = parse_quantity(limit_text)
        except ValueError:
            limit = 0
        if limit <= 0:
            raise PrepareError(
                f"{where}: sharing.mpsConfig.defaultPinnedDeviceMemoryLimit must be a positive "
                f"quantity (e.g. 10Gi), not {limit_text!r}"
            )
    return Sharing("MPS", active_thread_percentage=pct, pinned_memory_limit=limit)
