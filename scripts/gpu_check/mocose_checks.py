"""The gpu_check's checks of MoCoSE's own state on the device: the EMA target (a), the key queue (b) and
the sentence-transformers export (e).

(a) and (b) come from one MoCoSE run under `bf16=True` (autocast), `check_steps` optimizer steps, with a queue
small enough to wrap around. A callback placed after `EMATargetCallback` keeps, in float64 and with its own
arithmetic, a reference target: theta <- eta * theta + (1 - eta) * theta_online after each step, eta from the
cosine ramp written out here, each target tensor paired with its online twin by name. A wrapper around the
queue's `enqueue` keeps every batch of keys it is given; the queue is then replayed on the CPU in float64
(normalise, write slot (ptr + i) mod K) from its state before the first step.
(e) trains two steps, saves the checkpoint, exports it (`hf-mocose export`'s function, which itself checks the
export on the CPU) and compares `SentenceTransformer.encode` of the export with `MoCoSEModel.embed` of the
checkpoint, both on the device.
"""

from __future__ import annotations

import math

import torch

EXPORT_TOLERANCE = 1e-4  # fp32 on both sides; only the order of the kernels' sums may differ
QUEUE_TOLERANCE = 1e-6  # unit vectors normalised in fp32 on the device against float64 on the CPU
FP32_EPS = 2.0**-23


def twin_rules(model) -> list[tuple[str, str, str]]:
    """`(target name, online name, rule)` for every target parameter: "lerp" (averaged), "copy" (copied each
    step: the embedding module under `shared_embeddings="module"`) or "fixed" (the target encoder's 1-row word
    embedding placeholder: the online table is shared instead, so it never changes)."""
    params = dict(model.named_parameters())
    rules = []
    for name, param in params.items():
        if not name.startswith("target_"):
            continue
        online = "online_" + name[len("target_"):]
        if online not in params or params[online].shape != param.shape:
            rule = "fixed"
        elif model.config.shared_embeddings == "module" and name.startswith("target_encoder.embeddings."):
            rule = "copy"
        else:
            rule = "lerp"
        rules.append((name, online, rule))
    return rules


def cosine_ramp(step: int, total: int, start: float, end: float, horizon: int | None) -> float:
    """eta(t) = end - (end - start) (cos(pi t / T) + 1) / 2, T = horizon or the run length; written out here
    rather than imported, so that the check does not reuse the code it checks."""
    length = horizon or total
    return end - (end - start) * (math.cos(math.pi * min(step, length) / length) + 1) / 2


def ema_queue_recorder(model, args):
    """A `TrainerCallback` that keeps the reference target, the decays, the enqueued keys and the autocast dtype
    of the target's first linear layer (see the module docstring)."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.params = dict(model.named_parameters())
            self.rules = twin_rules(model)
            self.decays, self.enqueued, self.target_compute_dtype = [], [], None
            self.reference = self.initial = self.queue_before = None
            enqueue = model.queue.enqueue

            def recorded_enqueue(keys):
                self.enqueued.append(keys.detach().float().cpu().clone())
                enqueue(keys)

            model.queue.enqueue = recorded_enqueue  # instance attribute: the class is untouched
            linear = next(m for m in model.target_encoder.modules() if isinstance(m, torch.nn.Linear))
            self.hook = linear.register_forward_hook(self._dtype_hook)

        def _dtype_hook(self, module, inputs, output):
            self.target_compute_dtype = str(output.dtype)
            self.hook.remove()

        def on_train_begin(self, *_, **__):
            with torch.no_grad():
                self.reference = {t: self.params[t].detach().double().clone() for t, _, _ in self.rules}
                self.initial = {t: r.clone() for t, r in self.reference.items()}
                queue = model.queue
                self.queue_before = (queue.keys.detach().double().cpu().clone(), int(queue.queue_ptr),
                                     int(queue.queue_fill))

        def on_optimizer_step(self, _args, state, control, **kwargs):
            eta = cosine_ramp(state.global_step, state.max_steps, args.ema_decay_start, args.ema_decay_end,
                              args.ema_decay_horizon)
            self.decays.append(eta)
            with torch.no_grad():
                for target, online, rule in self.rules:
                    ref, theta = self.reference[target], self.params[online].detach().double()
                    if rule == "lerp":
                        ref.mul_(eta).add_(theta, alpha=1.0 - eta)
                    elif rule == "copy":
                        ref.copy_(theta)

    return Recorder()


def ema_result(recorder, ema_callback, steps: int) -> dict:
    from scripts.gpu_check.context import check_result

    params = recorder.params
    dtypes = sorted({str(params[t].dtype) for t, _, _ in recorder.rules})
    diff = max((params[t].detach().double() - recorder.reference[t]).abs().max().item() for t, _, _ in recorder.rules)
    largest = max(r.abs().max().item() for r in recorder.reference.values())
    moved = max((recorder.reference[t] - recorder.initial[t]).abs().max().item() for t, _, r in recorder.rules
                if r == "lerp")
    tolerance = 4 * steps * FP32_EPS * max(largest, 1.0)
    decay_gap = abs(recorder.decays[-1] - ema_callback.last_decay) if recorder.decays else float("inf")
    passed = (dtypes == ["torch.float32"] and diff <= tolerance and len(recorder.decays) == steps and moved > 0
              and decay_gap <= 1e-12 and recorder.target_compute_dtype == "torch.bfloat16")
    return check_result(
        passed, diff, tolerance, "max abs(target - float64 reference lerp) over all target parameters after "
        f"{steps} bf16-autocast steps (tolerance: 4 fp32 roundings per step of the largest value)",
        target_dtypes=dtypes, steps=len(recorder.decays), decays=recorder.decays, last_decay_gap=decay_gap,
        target_moved_by=moved, target_linear_output_dtype=recorder.target_compute_dtype,
        pairs={rule: sum(r == rule for _, _, r in recorder.rules) for rule in ("lerp", "copy", "fixed")})


def queue_result(recorder, queue, steps: int) -> dict:
    """Replays the enqueued keys on the CPU in float64 from the queue's state before the first step."""
    from scripts.gpu_check.context import check_result

    keys, ptr, fill = recorder.queue_before
    keys, capacity = keys.clone(), keys.shape[0]
    for batch in recorder.enqueued:
        batch = batch.double()
        batch = batch / batch.norm(dim=1, keepdim=True).clamp_min(1e-12)
        batch = batch[-capacity:]
        for i, row in enumerate(batch):
            keys[(ptr + i) % capacity] = row
        ptr, fill = (ptr + len(batch)) % capacity, min(fill + len(batch), capacity)
    diff = (queue.keys.detach().double().cpu() - keys).abs().max().item()
    written = sum(len(b) for b in recorder.enqueued)
    same_ring = ptr == int(queue.queue_ptr) and fill == int(queue.queue_fill)
    passed = (diff <= QUEUE_TOLERANCE and same_ring and len(recorder.enqueued) == steps
              and queue.keys.dtype == torch.float32 and written > capacity - recorder.queue_before[2])
    return check_result(passed, diff, QUEUE_TOLERANCE, f"max abs(device queue - CPU float64 replay) after {steps} "
                        "bf16-autocast steps (unit-length keys)",
                        queue_dtype=str(queue.keys.dtype), queue_device=str(queue.keys.device), capacity=capacity,
                        initial_fill=recorder.queue_before[2], keys_written=written,
                        enqueue_calls=len(recorder.enqueued),
                        pointer=(int(queue.queue_ptr), ptr), fill=(int(queue.queue_fill), fill))


def check_ema_and_queue(ctx) -> dict:
    """Checks (a) and (b) from one bf16 MoCoSE run; returns {check name: record}."""
    sizes = ctx.sizes
    capacity, initial = sizes.check_queue
    cfg = ctx.cfg(sizes.check_batch, sizes.check_steps, bf16=True, queue_size=capacity)
    sentences, _ = ctx.sentences(cfg.steps * cfg.batch_size)
    trainer, ema = ctx.trainer("mocose_previous", cfg, sentences, "ema-queue", queue_init_size=initial)
    model = trainer.model
    recorder = ema_queue_recorder(model, trainer.args)
    trainer.add_callback(recorder)  # after EMATargetCallback: each step's reference follows its update
    trainer.train()
    results = {"ema_fp32_lerp": ema_result(recorder, ema, cfg.steps),
               "queue_cpu_replay": queue_result(recorder, model.queue, cfg.steps)}
    del trainer, model, recorder
    return results


def check_export(ctx) -> dict:
    """Check (e): the export's embeddings against the checkpoint's `embed`, both on the device."""
    from sentence_transformers import SentenceTransformer

    from hf_mocose.data.corpus import python_docs_sentences
    from hf_mocose.publishing.export import (
        export_to_sentence_transformers,
        load_mocose_checkpoint,
        probe_sentences,
        reference_embeddings,
    )
    from scripts.gpu_check.context import check_result

    cfg = ctx.cfg(ctx.sizes.check_batch, 2)
    sentences, _ = ctx.sentences(cfg.steps * cfg.batch_size)
    # cls_dense: the export then has all three modules (Transformer, Pooling, Dense)
    trainer, _ = ctx.trainer("mocose_previous", cfg, sentences, "export-run", sentence_pooling="cls_dense")
    trainer.train()
    checkpoint, export_dir = ctx.workdir / "export-checkpoint", ctx.workdir / "export-st"
    trainer.save_model(str(checkpoint))
    del trainer
    export_to_sentence_transformers(checkpoint, export_dir, overwrite=True)  # verifies on the CPU (1e-5)
    exported_model = SentenceTransformer(str(export_dir), device=ctx.device)
    model, tokenizer = load_mocose_checkpoint(checkpoint)
    model.to(ctx.device)
    length = exported_model.max_seq_length
    probes = probe_sentences(tokenizer, length, model.config.max_seq_length) + python_docs_sentences()[:60]
    exported = exported_model.encode(probes, convert_to_tensor=True, batch_size=16).float().cpu()
    reference = reference_embeddings(model, tokenizer, probes, length, batch_size=16)
    diff = (exported - reference).abs().max().item()
    devices = sorted({str(exported_model.device), str(next(model.parameters()).device)})
    on_device = all(d.split(":")[0] == ctx.device.split(":")[0] for d in devices)
    return {"export_embeddings": check_result(
        diff <= EXPORT_TOLERANCE and on_device and exported.shape == reference.shape, diff, EXPORT_TOLERANCE,
        f"max abs(SentenceTransformer(export).encode - MoCoSEModel.embed) over {len(probes)} sentences (fp32)",
        devices=devices, max_seq_length=length, sentence_pooling=model.config.sentence_pooling,
        modules=[type(m).__name__ for m in exported_model], embedding_shape=list(exported.shape),
        reference_norm=round(reference.norm(dim=1).mean().item(), 4))}
