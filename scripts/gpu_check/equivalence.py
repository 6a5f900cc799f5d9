"""The gpu_check's equivalence checks: the same MoCoSE run on the CPU (f), sharded by FSDP2 (c) and compiled (d)
against the plain eager run on the device.

All four runs are `MoCoSETrainer` (method "mocose", fgsm_mode "previous") on the same sentences, built by
`scripts.benchmarks.train_variants.build_trainer` with the same seed, in fp32 without dropout (encoder and heads),
optimizer SGD, so that they are deterministic and an update is proportional to its gradient. Each records the loss of every
step (the value `compute_loss` returned, unrounded) and the whole model state before and after training
(online and target weights, heads, queue; FSDP2's `DTensor`s gathered). fp32 matrix products are full fp32 in
every run (TF32 off, set through torch's `fp32_precision` API after the trainer is built: transformers switches TF32
on for compiled runs on CUDA), and each run records the precision it trained with (`context.fp32_precision`).

(c) runs in a child process with torch.distributed initialised for one process (RANK=0, WORLD_SIZE=1) and the
Trainer's FSDP2 settings (`fsdp_config={"version": 2, ...}`: accelerate's `fully_shard`, one unit per
`BertLayer`); on the CPU the child first applies tests/fsdp_worker.py's shim (accelerate attaches its FSDP plugin
only on accelerator devices). (d) is `torch_compile=True` (inductor on CUDA; on the CPU `aot_eager`, dynamo and
AOTAutograd without inductor's code generation, which takes minutes on 2 cores) in this process. (f) runs in this
process too, with `use_cpu=True` (transformers resets accelerate's process-wide state for each `TrainingArguments`):
its losses and final key queue against the device's (`GPU_CPU_LOSS_RTOL`, `GPU_CPU_QUEUE_RTOL`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

DETERMINISTIC = dict(encoder_dropout=0.0, head_dropout=0.0, optim="sgd")
FSDP2 = dict(fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["BertLayer"]})
LOSS_RTOL = 1e-4  # per step, relative
STATE_RTOL = 1e-3  # norm(state - reference state) / norm(reference state - initial state): the updates agree to 0.1 %
# GPU against CPU, both fp32 with TF32 off: only the kernels' order of summation differs (cuBLAS against oneDNN/MKL,
# and CUDA's atomic adds in the embedding gradient). Each fp32 sum is then off by ~1e-7 to 1e-6 relative; three SGD
# steps carry that into the losses at ~1e-6 (measured on the CPU between one and two threads, which also reorders the
# sums: see docs/performance.md, "One-GPU acceptance check"). 1e-4 leaves two orders of magnitude for the GPU's longer sums.
GPU_CPU_LOSS_RTOL = 1e-4  # per step, relative
GPU_CPU_QUEUE_RTOL = 1e-4  # norm(device queue - CPU queue) / norm(CPU queue): unit-length keys, fp32


def full_state(model) -> dict:
    """Every floating tensor of the model's state, whole (`DTensor`s gathered), copied to the CPU."""
    from hf_mocose.models.ema import is_sharded

    return {name: (t.full_tensor() if is_sharded(t) else t).detach().cpu().clone()
            for name, t in model.state_dict().items() if t.is_floating_point()}


def recorded_run(ctx, name: str, **overrides) -> dict:
    """Trains the equivalence run with `overrides`; returns losses, state before/after and how it ran."""
    from accelerate.utils import is_compiled_module

    from hf_mocose.models.ema import is_sharded
    from scripts.gpu_check.context import fp32_precision, full_fp32

    sizes = ctx.sizes
    cfg = ctx.cfg(sizes.equivalence_batch, sizes.equivalence_steps)
    sentences, _ = ctx.sentences(cfg.steps * cfg.batch_size)
    trainer, _ = ctx.trainer("mocose_previous", cfg, sentences, name, learning_rate=sizes.equivalence_lr,
                             **DETERMINISTIC, **overrides)
    initial = full_state(trainer.model)
    losses: list[float] = []
    compute_loss = trainer.compute_loss

    def recorded_compute_loss(model, inputs, *args, **kwargs):
        result = compute_loss(model, inputs, *args, **kwargs)
        if model.training:
            losses.append((result[0] if isinstance(result, tuple) else result).detach().float().item())
        return result

    trainer.compute_loss = recorded_compute_loss  # instance attribute: the class is untouched
    full_fp32()  # after the trainer's set-up: transformers turns TF32 on for torch_compile=True on a GPU
    trainer.train()
    params = list(trainer.model.parameters())
    how = {"device": str(params[0].device), "fsdp": bool(trainer.is_fsdp_enabled),
           "compiled": is_compiled_module(trainer.model_wrapped),
           "sharded_parameters": sum(is_sharded(p) for p in params), "parameters": len(params),
           "world_size": trainer.args.world_size, "fp32_precision": fp32_precision()}
    result = {"losses": losses, "initial": initial, "final": full_state(trainer.model), "how": how}
    del trainer
    ctx.free_memory()
    return result


def compare(reference: dict, other: dict, what: str, extra_ok: bool, **detail) -> dict:
    """The check record of `other` against `reference` (see LOSS_RTOL, STATE_RTOL)."""
    from scripts.gpu_check.context import check_result

    ref, new, start = reference["final"], other["final"], reference["initial"]
    same_keys = sorted(ref) == sorted(new)
    keys = [k for k in ref if k in new]
    gap = sum(((new[k].double() - ref[k].double()) ** 2).sum().item() for k in keys) ** 0.5
    moved = sum(((ref[k].double() - start[k].double()) ** 2).sum().item() for k in keys) ** 0.5
    state_error = gap / moved if moved > 0 else float("inf")
    largest = {k: (new[k].double() - ref[k].double()).abs().max().item() for k in keys}
    worst = max(largest, key=largest.get)
    pairs = list(zip(reference["losses"], other["losses"]))
    loss_error = max((abs(a - b) / max(abs(a), 1e-12) for a, b in pairs), default=float("inf"))
    passed = (extra_ok and same_keys and len(pairs) == len(reference["losses"]) == len(other["losses"]) > 0
              and loss_error <= LOSS_RTOL and state_error <= STATE_RTOL)
    return check_result(
        passed, state_error, STATE_RTOL,
        f"norm(state after - eager state after) / norm(eager update) over every tensor (weights, EMA target, "
        f"queue), {what}",
        loss_relative_error=loss_error, loss_tolerance=LOSS_RTOL, losses=[b for _, b in pairs],
        eager_losses=reference["losses"], same_state_keys=same_keys, update_norm=moved,
        largest_difference={"tensor": worst, "max_abs": largest[worst]},
        run=other["how"], eager_run=reference["how"], **detail)


def check_compile(ctx, reference: dict) -> dict:
    """Check (d): `torch_compile=True` trains and matches the eager run."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # fresh caches: no earlier run's graphs, no recompilation limit reached
    graphs = counters["stats"]["unique_graphs"]
    backend = "inductor" if ctx.cuda else "aot_eager"
    start = time.monotonic()
    compiled = recorded_run(ctx, "compiled", torch_compile=True, torch_compile_backend=backend)
    captured = counters["stats"]["unique_graphs"] - graphs
    return {"torch_compile": compare(
        reference, compiled, f"torch_compile=True (backend {backend}) against eager", compiled["how"]["compiled"]
        and captured > 0, backend=backend, graphs_captured=captured, seconds=round(time.monotonic() - start, 1))}


def check_gpu_cpu(ctx, reference: dict) -> dict:
    """The GPU-against-CPU check: the reference run (fp32, no dropout, TF32 off, on the device) again on the CPU of
    the same machine, in this process; their losses and final key queues compared. On a CPU-only machine both runs
    are CPU runs (`cpu_against_cpu` says so): the same code, a trivially passing comparison."""
    import dataclasses

    from scripts.gpu_check.context import check_result

    cpu = recorded_run(dataclasses.replace(ctx, device="cpu"), "cpu-replay")
    pairs = list(zip(reference["losses"], cpu["losses"]))
    loss_error = max((abs(a - b) / max(abs(a), 1e-12) for a, b in pairs), default=float("inf"))
    queue = next(k for k in reference["final"] if k.endswith("queue.keys"))
    device_queue, cpu_queue = reference["final"][queue].double(), cpu["final"][queue].double()
    queue_error = ((device_queue - cpu_queue).norm() / cpu_queue.norm().clamp_min(1e-12)).item()
    keys = [k for k in reference["final"] if k in cpu["final"]]
    gap = sum(((cpu["final"][k].double() - reference["final"][k].double()) ** 2).sum().item() for k in keys) ** 0.5
    moved = sum(((reference["final"][k].double() - reference["initial"][k].double()) ** 2).sum().item()
                for k in keys) ** 0.5
    devices = (reference["how"]["device"], cpu["how"]["device"])
    right_devices = devices[1] == "cpu" and devices[0].split(":")[0] == ctx.device.split(":")[0]
    passed = (right_devices and len(pairs) == len(reference["losses"]) == len(cpu["losses"]) > 0
              and loss_error <= GPU_CPU_LOSS_RTOL and queue_error <= GPU_CPU_QUEUE_RTOL)
    return {"gpu_against_cpu": check_result(
        passed, queue_error, GPU_CPU_QUEUE_RTOL, f"norm(final key queue on {devices[0]} - on cpu) / norm(on cpu) "
        f"after {len(pairs)} fp32 steps, dropout off, TF32 off; losses too, relative (loss_tolerance)",
        cpu_against_cpu=devices[0] == "cpu", devices=list(devices), loss_relative_error=loss_error,
        loss_tolerance=GPU_CPU_LOSS_RTOL, device_losses=reference["losses"], cpu_losses=cpu["losses"],
        state_relative_error=gap / moved if moved > 0 else None, queue_tensor=queue, run=cpu["how"],
        device_run=reference["how"])}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_fsdp(ctx, reference: dict, script: Path, seconds: float) -> dict:
    """Check (c): the FSDP2 run in a child process (world size 1) against the eager run of this process."""
    out = ctx.workdir / "fsdp2-run.pt"
    spec = {"device": ctx.device, "tiny": ctx.tiny, "model_path": ctx.model_path, "workdir": str(ctx.workdir),
            "sizes": asdict(ctx.sizes), "seconds": seconds, "out": str(out)}
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    from scripts.gpu_check.context import run_own_session

    code = run_own_session([sys.executable, str(script), "--_fsdp_child", json.dumps(spec)], seconds,
                           "the FSDP2 process", env=env)
    if code != 0 or not out.is_file():
        raise RuntimeError(f"the FSDP2 process exited with code {code} (its output is above)")
    sharded = torch.load(out, weights_only=True)
    how = sharded["how"]
    ok = how["fsdp"] and how["sharded_parameters"] == how["parameters"] > 0 and how["world_size"] == 1
    return {"fsdp2_world1": compare(reference, sharded, "FSDP2 (fully_shard, world size 1) against unsharded", ok)}


def fsdp_child(spec: dict) -> int:
    """The child of `check_fsdp`: trains the equivalence run under FSDP2 and saves what `compare` reads."""
    from scripts import REPO
    from scripts.gpu_check.context import RunContext, Sizes, quiet_libraries

    quiet_libraries()
    ctx = RunContext(device=spec["device"], tiny=spec["tiny"], model_path=spec["model_path"],
                     workdir=Path(spec["workdir"]), deadline=time.monotonic() + spec["seconds"],
                     sizes=Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["sizes"].items()}))
    if not ctx.cuda:
        sys.path.insert(0, str(REPO / "tests"))
        from fsdp_worker import enable_fsdp_on_cpu  # test-only shim: FSDP on the CPU (see its docstring)

        enable_fsdp_on_cpu()
    ctx.log("FSDP2 child: training under fully_shard, world size 1")
    result = recorded_run(ctx, "fsdp2", **FSDP2)
    del result["initial"]  # the parent compares with its own run's
    torch.save(result, spec["out"])
    ctx.log(f"FSDP2 child: done, losses {result['losses']}")
    return 0
