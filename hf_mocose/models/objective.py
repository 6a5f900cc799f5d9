"""The training step of every method, shared by both front ends: FGSM, then the loss of a forward, then the enqueue.

`MoCoSETrainer.compute_loss` (a `MoCoSEModel`) and `MoCoSELoss.forward` (any `SentenceTransformer`) run the same
four lines (`ContrastiveObjective`'s docstring):

1. FGSM (Goodfellow et al.): x' = x + epsilon * sign(grad_x L) on the online word embeddings `(B, L, H)`
   (`perturbation`). Mode "previous" (the reference code's, free) reuses the sign the last backward left, cropped
   or zero-filled to this batch's shape; "exact" takes the sign of the loss's gradient on a probe forward of the
   clean batch; "off". epsilon is "absolute" (the paper's 5e-9, about one float32 ulp of an entry: it rounds away
   in bf16) or "embedding_rms" (a fraction of the batch's word-embedding RMS, the same for every encoder and
   precision). More in docs/methods.md.
2. The front end's forward with that delta (`models.branches`): queries `(B, D)` from the online branch, keys
   `(B, D)` from the EMA target (no gradient) or a second dropout view, optional hard negatives and IFCL's
   fraternal view.
3. The loss of its outputs (`__call__`): InfoNCE (`info_nce_loss`) against the global batch's other keys (gathered
   in rank order), the queue (age windows, IFCL's forgetting weights) and UNA's hard negatives, plus IFCL's
   fraternal InfoNCE and Twins loss, and the step metrics (`logged_metrics`).
4. The enqueue of the step's keys (MoCoSE: target keys; ESimCSE: the momentum encoder's anchors; IFCL: online
   anchors), at the end of the loss's backward pass. Why there: the loss must never see its own keys as
   negatives, and a forward that the backward recomputes (gradient checkpointing) must see the queue the loss
   saw; both front ends then enqueue at the same point without a hook of their own.

Matryoshka (`matryoshka_dims` d_1 > d_2 > ..., weights w_j): sum_j w_j InfoNCE on the first d_j entries of the
queries, keys, gathered keys, queue and hard negatives, one slice of the full loss's tensors (cosines re-normalise
each cut, so one queue of full unit keys serves every d_j; one forward). The cut sits on the heads' outputs, not in
front of shared heads (that needs a head pass and a queue per width) nor on the pooled embedding (that bypasses the
predictor and queue): with identity-initialised heads a key is LayerNorm(embedding), so its prefix is the prefix
`truncate_dim=d` reads. IFCL's fraternal and Twins terms stay full width (docs/methods.md, "Matryoshka").

The EMA update of the target runs after the optimizer step (`models.ema`). Read one step in this order: this
module, `branches.py` (the forward), `queue.py`, `ema.py`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd import Variable
from torch.nn import functional as F

from ..compat import all_gather, get_rank, get_world_size
from .mtd import max_traceable_distance
from .losses import ContrastiveLossOutput, info_nce_loss, twins_loss
from .branches import MoCoSEOutput
from .queue import KeyQueue

# Each process's FGSM "previous" sign in a checkpoint folder, written and read by both front ends.
FGSM_STATE_FILE = "fgsm_rank{rank}.pt"


class FGSMPerturbation:
    """The FGSM settings (`fgsm_mode`, `fgsm_epsilon`, `fgsm_views`, `fgsm_epsilon_unit`, checked by
    `models.settings.validate_settings`) and, for mode "previous", the sign of the last gradient."""

    def __init__(self, mode: str = "previous", epsilon: float = 5e-9, views: str = "both",
                 epsilon_unit: str = "absolute"):
        self.mode, self.epsilon, self.views, self.epsilon_unit = mode, epsilon, views, epsilon_unit
        self.last_gradient_sign: Tensor | None = None
        self.last_step_size: Tensor | float = epsilon

    @property
    def perturb_target(self) -> bool:
        return self.views == "both"

    def step_size(self, word_embeddings: Tensor) -> Tensor | float:
        """The step for embeddings like `word_embeddings` `(B, L, H)`: epsilon, or epsilon x their RMS
        (a 0-dim tensor, no host sync) for `epsilon_unit="embedding_rms"`."""
        return self.epsilon if self.epsilon_unit == "absolute" else (
            self.epsilon * word_embeddings.detach().float().pow(2).mean().sqrt())

    def previous_perturbation(self, word_embeddings_shape: torch.Size) -> Tensor | None:
        """The "previous" perturbation `(B, L, H)` for embeddings of this shape, or None (first step).

        A sign of another shape (a short last batch, dynamic padding) is cropped or zero-filled: it belongs
        to other sentences anyway (the reference code reuses the previous batch's), so only the shape must fit."""
        if self.mode != "previous" or self.last_gradient_sign is None:
            return None
        rows, length = word_embeddings_shape[:2]
        sign = self.last_gradient_sign[:rows, :length]
        return self.last_step_size * F.pad(sign, (0, 0, 0, length - sign.shape[1], 0, rows - sign.shape[0]))

    def track(self, word_embeddings: Tensor, gradient_at: Tensor | None = None) -> None:
        """Keeps the sign of the gradient the coming backward leaves on `word_embeddings` `(B, L, H)` (mode
        "previous"), and their step size. `gradient_at` `(B, L, H)`: where to read that gradient instead (the
        clean input embeddings: under `torch_compile` only a compiled module's inputs get gradients)."""
        source = word_embeddings if gradient_at is None else gradient_at
        if self.mode == "previous" and source.requires_grad:
            source.register_hook(self._store)
            self.last_step_size = self.step_size(word_embeddings)

    def _store(self, gradient: Tensor) -> None:
        self.last_gradient_sign = torch.sign(gradient.detach())

    def state_dict(self) -> dict:
        return {"last_gradient_sign": self.last_gradient_sign, "last_step_size": self.last_step_size}

    def save(self, folder: str | Path, rank: int) -> None:
        """Writes this process's "previous" state into a checkpoint `folder` (nothing for the other modes)."""
        if self.mode == "previous":
            torch.save(self.state_dict(), Path(folder) / FGSM_STATE_FILE.format(rank=rank))

    def load(self, folder: str | Path, rank: int, device, *older_names: str) -> None:
        """Reads what `save` wrote (or a file of one of `older_names`, formatted with `rank`), if any."""
        for name in (FGSM_STATE_FILE, *older_names):
            path = Path(folder) / name.format(rank=rank)
            if self.mode == "previous" and path.is_file():
                # Read onto the CPU, then moved: torch.load cannot map to "cpu:0", the device of DDP on CPU.
                state = {k: v.to(device) if isinstance(v, Tensor) else v
                         for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
                self.last_gradient_sign = state.get("last_gradient_sign")
                self.last_step_size = state.get("last_step_size", self.epsilon)
                return


def gather(tensor: Tensor, with_grad: bool) -> Tensor:
    """`(n, D)` of every process in rank order (sentence-transformers' `all_gather`, which warns on one
    process: skipped there); `with_grad` keeps the local rows' gradient."""
    return all_gather(tensor.contiguous(), with_grad=with_grad) if get_world_size() > 1 else tensor


def mean_pairwise_cosine(vectors: Tensor) -> Tensor:
    """Mean cosine between distinct rows of `(N, D)`: near 1 when the representation collapses."""
    n = vectors.shape[0]
    if n < 2:
        return torch.zeros((), device=vectors.device)
    unit = F.normalize(vectors.detach().float(), dim=1)
    total = unit.sum(0)
    return ((total @ total) - n) / (n * (n - 1))  # sum over i != j of u_i.u_j, without the N x N matrix


def check_matryoshka_width(dims: list[int] | None, key_dim: int, embedding_dim: int) -> None:
    """Refuses `matryoshka_dims` whose first entry is not the full width of both the keys and the sentence embedding
    (a cut of the keys trains the exported embedding's prefix only when the two are the same vector width)."""
    if dims and not dims[0] == key_dim == embedding_dim:
        raise ValueError(f"matryoshka_dims={list(dims)!r} must start with the full width: the keys are {key_dim} wide "
                         f"and the sentence embedding {embedding_dim} (projection_dim, if set, must equal the hidden "
                         "size).")


def run_after_backward(loss: Tensor, fn: Callable[[], None]) -> None:
    """Runs `fn` once the backward pass through `loss` has finished (at once if `loss` has no gradient): a
    hook on `loss` queues it as an autograd final callback, run after every gradient of that backward."""
    if not loss.requires_grad:
        fn()
        return
    loss.register_hook(lambda grad: Variable._execution_engine.queue_callback(fn))


class ContrastiveObjective:
    """The training step of every method; the methods differ only in `config`. A front end runs, top to bottom:

        probe = model(batch) if objective.fgsm.mode == "exact" else None     # FGSM "exact": a clean pass
        perturbation = objective.perturbation(embedding_shape, probe, queue)   # FGSM's delta, or None
        outputs = model(batch, perturbation)                                   # queries, keys (`ContrastiveBranches`)
        result = objective(outputs, queue)                                     # InfoNCE; the enqueue after backward

    Args:
        config: what the method is: `method` ("mocose", "simcse", "ifcl", "esimcse"), `contrastive_temperature`,
            `in_batch_negatives`, `keys_from_target`, `uses_queue` (a `MoCoSEConfig`).
        fgsm: the FGSM settings and the "previous" sign (`FGSMPerturbation`; mode "off" for no FGSM).
        queue_age_slices: age ranges of the queue used as negatives (`queue_slice`), or None for all.
        forgetting: IFCL's lambda (`ifcl_forgetting`: the forgetting weight per queued batch), or None.
        queue_window: `queue_window(decay=None)`, the newest queue entries in use at this step or at that EMA decay
            (`target_mtd`), or None for all.
        matryoshka_dims: the Matryoshka widths d_1 > d_2 > ... (d_1 the key width), or None for the full loss only.
        matryoshka_weights: their weights (default ones).
    """

    def __init__(self, config, fgsm: FGSMPerturbation, *, queue_age_slices: list[tuple[int, int]] | None = None,
                 forgetting: float | None = None, queue_window: Callable[..., int | None] | None = None,
                 matryoshka_dims: list[int] | None = None, matryoshka_weights: list[float] | None = None):
        self.config, self.fgsm = config, fgsm
        self.matryoshka_dims = tuple(matryoshka_dims) if matryoshka_dims else None
        self.matryoshka_weights = None if self.matryoshka_dims is None else tuple(
            matryoshka_weights or [1.0] * len(self.matryoshka_dims))
        self.queue_age_slices = queue_age_slices
        self.forgetting = forgetting if config.method == "ifcl" else None
        self.queue_window = queue_window or (lambda decay=None: None)
        self.keys_per_batch = 0  # keys one training micro-batch enqueued, all processes (B of d_trace, IFCL's N)
        self.metric_sums: dict[str, Tensor] = defaultdict(lambda: torch.zeros(()))
        self.metric_steps = 0

    @classmethod
    def from_settings(cls, config, settings, *, key_dim: int, embedding_dim: int, **kwargs) -> "ContrastiveObjective":
        """The objective of `config`'s method with the FGSM, IFCL and Matryoshka values of `settings` (a mapping of the
        method settings: `MoCoSETrainingArguments` or `MoCoSELoss`'s); FGSM only for a method with target keys.
        `key_dim` / `embedding_dim`: the width of the keys and of the sentence embedding (Matryoshka needs both equal
        to its first dimension)."""
        fgsm = FGSMPerturbation(settings["fgsm_mode"] if config.keys_from_target else "off", settings["fgsm_epsilon"],
                                settings["fgsm_views"], settings["fgsm_epsilon_unit"])
        dims = settings.get("matryoshka_dims")
        check_matryoshka_width(dims, key_dim, embedding_dim)
        return cls(config, fgsm, forgetting=settings["ifcl_forgetting"], matryoshka_dims=dims,
                   matryoshka_weights=settings.get("matryoshka_weights"), **kwargs)

    # ----------------------------------------------------------------- the step
    def perturbation(self, embedding_shape: torch.Size, probe: MoCoSEOutput | None = None,
                     queue: KeyQueue | None = None) -> Tensor | None:
        """FGSM's `(B, L, H)` delta for a training step on word embeddings of `embedding_shape`: "previous" fits the
        sign the last backward left; "exact" takes the sign of the loss's gradient on `probe`, the forward of the
        clean batch (run on the unwrapped model, so that DDP's gradient hooks never fire for it); None for "off"."""
        if self.fgsm.mode == "previous":
            return self.fgsm.previous_perturbation(embedding_shape)
        if self.fgsm.mode == "exact":
            (gradient,) = torch.autograd.grad(self.loss(probe, queue)[0].loss, probe.fgsm_gradient_at)
            return self.fgsm.step_size(probe.fgsm_gradient_at) * torch.sign(gradient)
        return None

    def __call__(self, outputs: MoCoSEOutput, queue: KeyQueue | None, training: bool = True) -> ContrastiveLossOutput:
        """The loss of a forward's `outputs`; in training also FGSM's tracking, the step metrics and, at the end of
        the loss's backward, the enqueue of the step's keys (module docstring, 4)."""
        if not training:
            return self.loss(outputs, queue)[0]
        self.fgsm.track(outputs.word_embeddings, gradient_at=outputs.fgsm_gradient_at)
        result, keys = self.loss(outputs, queue, training)
        self.keys_per_batch = keys.shape[0]
        if queue is not None:  # MoCoSE queues target keys, ESimCSE momentum embeddings, IFCL online anchors
            queued = keys.detach() if self.config.keys_from_target else gather(
                (outputs.query if outputs.target_embedding is None else outputs.target_embedding).detach(), False)
            run_after_backward(result.loss, lambda: queue.enqueue(queued))
        self._accumulate({"pos_cos": result.positive_cosine, "neg_cos": result.negative_cosine,
                          "key_cos": mean_pairwise_cosine(keys)})
        return result

    # ----------------------------------------------------------------- the loss
    def loss(self, outputs: MoCoSEOutput, queue: KeyQueue | None,
             training: bool = False) -> tuple[ContrastiveLossOutput, Tensor]:
        """InfoNCE of one forward (plus IFCL's fraternal losses); returns it and the gathered keys `(B_global, D)`."""
        config = self.config
        with_grad = not config.keys_from_target  # MoCoSE's target keys carry no gradient; a dropout view does
        keys = gather(outputs.key, with_grad)
        # Without in-batch negatives each query sees its own key only (with its gradient in SimCSE/IFCL).
        queries, candidates, positive_index = outputs.query, outputs.key, None
        if config.in_batch_negatives:
            positive_index, candidates = self._own_rows(outputs.key.shape[0], keys.device), keys
        negatives, weights = [], []
        if queue is not None:
            negatives.append(queue.keys)
            weights.append(queue.negative_weights(
                age_slices=self.queue_age_slices, newest=self.queue_window(), forgetting=self.forgetting,
                entries_per_batch=keys.shape[0]))
        if outputs.negative_keys is not None:  # hard negatives: shared by all anchors of the global batch
            hard = gather(outputs.negative_keys, with_grad)
            if outputs.negative_queries is not None:  # UNA as in its paper: anchors too, with their own positive
                queries = torch.cat([queries, outputs.negative_queries])
                own = keys.shape[0] + self._own_rows(outputs.negative_keys.shape[0], hard.device)
                positive_index, candidates = torch.cat([positive_index, own]), torch.cat([candidates, hard])
            else:
                negatives.append(hard)
                weights.append(torch.ones(hard.shape[0], device=hard.device))
        negatives = torch.cat(negatives) if negatives else None
        weights = torch.cat(weights) if weights else None
        result = info_nce_loss(queries, candidates, config.contrastive_temperature, positive_index=positive_index,
                               extra_negatives=negatives, extra_negative_weights=weights)
        if self.matryoshka_dims is not None:  # sum_j w_j InfoNCE on the first d_j dimensions of every vector
            result.loss = self.matryoshka_weights[0] * result.loss + sum(weight * info_nce_loss(
                queries[:, :dim], candidates[:, :dim], config.contrastive_temperature, positive_index=positive_index,
                extra_negatives=None if negatives is None else negatives[:, :dim], extra_negative_weights=weights).loss
                for dim, weight in zip(self.matryoshka_dims[1:], self.matryoshka_weights[1:]))
        if outputs.fraternal_query is not None:
            result.loss = result.loss + self._fraternal_losses(outputs, training)
        return result, keys

    def _fraternal_losses(self, outputs: MoCoSEOutput, training: bool) -> Tensor:
        """IFCL: l_F (in-batch InfoNCE anchor vs fraternal view, over the global batch) + l_T (Twins loss)."""
        fraternal = gather(outputs.fraternal_query, True)
        positive_index = self._own_rows(outputs.query.shape[0], fraternal.device)
        loss_f = info_nce_loss(outputs.query, fraternal, self.config.contrastive_temperature,
                               positive_index=positive_index).loss
        anchor_input, fraternal_input = outputs.input_embeddings
        # The identical twin reads the anchor's own text, so its input embedding is the anchor's.
        loss_t = twins_loss(outputs.query, outputs.key, outputs.fraternal_query, anchor_input, anchor_input, fraternal_input)
        if training:
            self._accumulate({"loss_fraternal": loss_f, "loss_twins": loss_t}, count=False)
        return loss_f + loss_t

    @staticmethod
    def _own_rows(local: int, device) -> Tensor:
        """`(local,)` rows of this process's `local` entries in a tensor gathered from all processes."""
        return torch.arange(local, device=device) + get_rank() * local

    # ----------------------------------------------------------------- metrics
    def _accumulate(self, values: dict[str, Tensor], count: bool = True) -> None:
        for name, value in values.items():
            self.metric_sums[name] = self.metric_sums[name].to(value.device) + value.detach()
        self.metric_steps += count

    def pop_metrics(self) -> dict[str, Tensor]:
        """This process's mean of each step metric since the last call (0-dim tensors, no host sync), then resets:
        `pos_cos` / `neg_cos` (queries with their positive / negatives), `key_cos` (between the step's keys: near 1
        when the representation collapses), IFCL's `loss_fraternal` and `loss_twins`."""
        steps, sums = self.metric_steps, dict(self.metric_sums)
        self.metric_sums.clear()
        self.metric_steps = 0
        return {name: total / steps for name, total in sums.items()} if steps else {}

    def logged_metrics(self, queue: KeyQueue | None, decay: float | None,
                       accumulation_steps: int = 1) -> dict[str, float]:
        """The step metrics of a logging step, as both front ends log them: `pop_metrics` averaged over the
        processes (one all-reduce), `queue_fill`, and with an EMA target the last `ema_decay` and `d_trace`.

        d_trace = 1/(1-eta) + K/B (`models.mtd`): K the queue entries in use at that decay (`queue_window`, else
        the oldest `queue_age_slices` age, else the queue), B the keys enqueued per optimizer step: the last
        training batch of all processes times `accumulation_steps`. {} when no training step ran since the last call.
        """
        metrics = self.pop_metrics()
        if not metrics:
            return {}
        values = torch.stack([value.float() for value in metrics.values()])
        if get_world_size() > 1:
            torch.distributed.all_reduce(values)  # SUM, then divide: gloo has no AVG
            values /= get_world_size()
        logs = {name: round(value, 4) for name, value in zip(metrics, values.tolist())}
        if queue is not None:
            logs["queue_fill"] = int(queue.queue_fill)
        if decay is not None:
            reach = self.queue_window(decay)
            if reach is None:
                slices = self.queue_age_slices
                reach = min(max(end for _, end in slices), queue.capacity) if slices else queue.capacity
            logs["ema_decay"] = round(decay, 6)
            logs["d_trace"] = round(max_traceable_distance(decay, reach, self.keys_per_batch * accumulation_steps), 4)
        return logs
