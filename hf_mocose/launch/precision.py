"""Mixed precision: the target's no-grad forward under the online forward's autocast, and native bf16 detection.

With `bf16=True` (or `fp16=True` on a GPU) accelerate wraps the model's `forward` in `torch.autocast`; the EMA
target's forward must run under the same autocast while its weights stay fp32 (bf16 would round away the EMA's
(1 - eta) * delta steps). `MoCoSELoss` calls its target outside the online `forward`, so `recorded_autocast` reads
that autocast and `AutocastState.context()` enters it again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

AUTO = "auto"  # `bf16: auto` in a recipe (the quickstart's): `choose_auto_bf16` decides
# torch's probes (cpuinfo) of x86 bf16 arithmetic: AVX512-BF16 dot products, AMX tiles.
NATIVE_BF16_CPU_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


@dataclass(frozen=True)
class AutocastState:
    """The autocast a forward ran under: `dtype` on `device_type`, or none (`dtype=None`)."""

    device_type: str = "cpu"
    dtype: torch.dtype | None = None

    def context(self) -> contextlib.AbstractContextManager:
        """`torch.autocast` as recorded; with `dtype=None` autocast is off inside (also under an outer one)."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)


@contextlib.contextmanager
def recorded_autocast(module: nn.Module) -> Iterator[dict[str, AutocastState]]:
    """While the block runs, records in the yielded `["state"]` the autocast `module`'s forward runs under. `module`
    is one the online `forward` calls, not the model itself (accelerate's autocast wraps it, outside its hooks).
    A dict: a compiled forward runs the hook inside its graph, and dynamo traces dict writes (not attributes')."""
    recording = {"state": AutocastState()}
    # Read here, not in the hook: dynamo (torch 2.6) cannot trace `next(iterator, default)` in a fullgraph compile.
    parameter = next(module.parameters(), None)
    device_type = parameter.device.type if parameter is not None else "cpu"

    def hook(mod, args):
        enabled = torch.is_autocast_enabled(device_type)
        recording["state"] = AutocastState(device_type, torch.get_autocast_dtype(device_type) if enabled else None)

    with module.register_forward_pre_hook(hook):  # the handle removes the hook on leaving
        yield recording


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), so `bf16: auto` picks it; unknown: False."""
    probes = [getattr(torch.cpu, name, None) for name in NATIVE_BF16_CPU_PROBES]
    return any(probe() for probe in probes if probe is not None)


def choose_auto_bf16(device: torch.device, deepspeed: bool = False) -> tuple[bool, str]:
    """What `bf16: auto` resolves to for training on `device`, and why: bf16 autocast on a CUDA GPU that computes
    bf16 natively (`torch.cuda.is_bf16_supported`, emulation not counted: Ampere and later) and on a CPU that does
    (about 0.6x the fp32 step time at the same STS quality there, docs/performance.md); fp32 elsewhere, and under
    DeepSpeed (which would cast the EMA target to bf16). The EMA target, weights and optimizer state stay fp32."""
    if deepspeed:
        return False, "under DeepSpeed bf16 would cast the EMA target to bf16 too"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, "this GPU computes bf16 natively (torch.cuda.is_bf16_supported)"
        return False, "this GPU has no native bf16; TF32 matmuls only with --tf32 true (default: full fp32)"
    if device.type != "cpu":
        return False, f"training on {device.type}; auto picks bf16 only on CUDA GPUs and CPUs with native bf16"
    if cpu_has_native_bf16():
        return True, "this CPU computes bf16 natively (AVX512-BF16 or AMX)"
    return False, "this CPU has no native bf16 (neither AVX512-BF16 nor AMX)"
