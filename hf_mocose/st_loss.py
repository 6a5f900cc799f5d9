"""`MoCoSELoss`: MoCoSE as a sentence-transformers loss, for `SentenceTransformerTrainer`.

    loss = MoCoSELoss(model, queue_size=512, ema_decay=0.75, ema_decay_end=0.95, temperature=0.05)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss).train()

The second front end of `MoCoSETrainer`'s method, from the same `KeyQueue`, `info_nce_loss`,
`EMATargetCallback`, `FGSMPerturbation` and head builders, for any `SentenceTransformer`:

    online:  anchor   -> model (its own pooling) -> pooler -> projection -> predictor = query   (optimised)
    target:  positive -> EMA copy of model       -> EMA pooler -> EMA projection     = key     (EMA only)

The positive is the sentence itself (one text column: the views differ by dropout and FGSM) or the
second column of (anchor, positive) pairs. The keys of all processes are gathered, contrasted with
every query beside the queue, then enqueued. The model, with its own pooling, is what gets saved.

`SentenceTransformerTrainer` saves only the model, so `MoCoSELoss.callback` (an `EMATargetCallback`,
in the style of TRL's `SyncRefModelCallback`) drives the rest: the EMA after every optimizer step,
the loss state written into each checkpoint (`checkpoint-N/mocose_loss/`) and read back on resume.
The loss attaches it to the Trainer that calls it at its first training step; pass
`callbacks=[loss.callback]` to attach it from the start (the data is then checked before the first
batch is collated).
"""

from __future__ import annotations

import copy
import sys
from collections import OrderedDict
from collections.abc import Iterable
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.utils import extract_model_from_parallel
from sentence_transformers import SentenceTransformer
from sentence_transformers.util.distributed import all_gather
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .augmentation import FGSMPerturbation
from .callbacks import EMATargetCallback, EMATensorPairs, ema_tensor_pairs, validate_ema_decay
from .configuration import validate_method_hparams
from .losses import ContrastiveLossOutput, info_nce_loss
from .heads import build_predictor, build_projection, head_linear, init_head_weights
from .queue import KeyQueue
from .sharding import accelerator_sharding, launch_sharding, refuse_unsupported_sharding

LOSS_STATE_DIR = "mocose_loss"
STATE_FILE = "state.pt"
FGSM_STATE_FILE = "fgsm_rank{rank}.pt"
LABEL_COLUMNS = ("label", "labels", "score", "scores")  # what sentence-transformers' collator reads as labels


def _unwrap(module: nn.Module) -> nn.Module:
    """The module inside DDP / DataParallel / `torch.compile` wrappers."""
    return extract_model_from_parallel(module, keep_torch_compile=False)


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _calling_trainer(max_depth: int = 64) -> Trainer | None:
    """The `transformers.Trainer` whose method (`compute_loss`) is running the loss, from the call stack."""
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        if isinstance(frame.f_locals.get("self"), Trainer):
            return frame.f_locals["self"]
        frame = frame.f_back
    return None


def _word_embeddings(model: SentenceTransformer) -> nn.Module:
    """The word-embedding module of the model's transformers encoder (where FGSM adds its perturbation)."""
    transformer = model.transformers_model
    embeddings = transformer.get_input_embeddings() if hasattr(transformer, "get_input_embeddings") else None
    if embeddings is None:
        raise ValueError(f"FGSM perturbs word embeddings, but this SentenceTransformer's first module "
                         f"({type(model[0]).__name__}) has no transformers encoder with input embeddings: set fgsm_mode='off'.")
    return embeddings


def _check_unsharded() -> None:
    """No FSDP (accelerate cannot map the heads' optimizer state onto a sharded model), no ZeRO-3
    (`sharding.refuse_unsupported_sharding`); read from the accelerator, else from the launch environment."""
    from accelerate.state import AcceleratorState, is_initialized

    sharding = accelerator_sharding(AcceleratorState()) if is_initialized() else launch_sharding()
    refuse_unsupported_sharding("MoCoSELoss", *sharding, fsdp2_supported=False)


def _parts(dataset) -> list:
    """The datasets inside a `DatasetDict` or the `ConcatDataset` sentence-transformers makes of one."""
    if dataset is None:
        return []
    if hasattr(dataset, "datasets"):  # torch's ConcatDataset
        return list(dataset.datasets)
    return list(dataset.values()) if isinstance(dataset, dict) else [dataset]


class MoCoSELossCallback(EMATargetCallback):
    """Runs a `MoCoSELoss` from the Trainer loop: the EMA after each optimizer step (inherited), the
    checks and resume at `on_train_begin`, the loss state into every checkpoint at `on_save`."""

    def __init__(self, mocose_loss: MoCoSELoss):
        settings = mocose_loss.settings
        super().__init__(mocose_loss, settings["ema_decay"], settings["ema_decay_end"], settings["ema_decay_horizon"])
        self.mocose_loss = mocose_loss

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.mocose_loss.begin_training(args, state, getattr(train_dataloader, "dataset", None))

    def on_save(self, args, state, control, **kwargs):
        self.mocose_loss.save_state(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", args)

    def on_train_end(self, args, state, control, **kwargs):
        self.mocose_loss._ready = False  # a later train() call runs the checks (and any resume) again


class MoCoSELoss(nn.Module):
    """MoCoSE (EMA target, predictor, key queue, optional FGSM) for a `SentenceTransformer`.

    Data: one text column (sentences), or two ((anchor, positive) pairs, the positive read by the
    target); no label column. Train it with `SentenceTransformerTrainer`, which optimises the model
    and the online heads (`online_head`); the target (`target_encoder`, `target_head`) and the queue
    are moved by the callback and the loss only.

    Args:
        model: the `SentenceTransformer` to train (its tokenizer reads the text).
        queue_size: K, negatives kept in the queue (at most the number of training rows).
        queue_init_size: K_s, random unit vectors the queue starts with; defaults to min(128, K).
        ema_decay, ema_decay_end: EMA decay eta at the first step and at the end of its cosine ramp.
        ema_decay_horizon: optimizer steps the ramp takes (None: the whole run).
        temperature: InfoNCE temperature tau.
        in_batch_negatives: the other keys of the global batch are negatives too.
        projection_layers, predictor_layers, predictor_dim, head_dropout, head_init: the heads, as
            `MoCoSEConfig`'s fields (`head_init="identity"` starts the query close to the key).
        target_dropout: the target runs with dropout in training.
        fgsm_mode, fgsm_epsilon, fgsm_views, fgsm_epsilon_unit: FGSM on the anchor's word embeddings
            (`FGSMPerturbation`): "off" (default), "exact" (an extra forward/backward) or "previous" (the
            last step's gradient; needs every batch padded to the same length).
    """

    def __init__(self, model: SentenceTransformer, queue_size: int = 512, queue_init_size: int | None = None,
                 ema_decay: float = 0.75, ema_decay_end: float = 0.95, ema_decay_horizon: int | None = None,
                 temperature: float = 0.05, in_batch_negatives: bool = True, projection_layers: int = 1,
                 predictor_layers: int = 2, predictor_dim: int | None = None, head_dropout: float = 0.1,
                 head_init: str = "identity", target_dropout: bool = True, fgsm_mode: str = "off",
                 fgsm_epsilon: float = 5e-9, fgsm_views: str = "both", fgsm_epsilon_unit: str = "absolute"):
        super().__init__()
        if not isinstance(model, SentenceTransformer):
            raise TypeError(f"MoCoSELoss trains a sentence_transformers.SentenceTransformer, got {type(model).__name__}.")
        if len(model) == 0 or getattr(model[0], "tokenizer", None) is None:
            first = type(model[0]).__name__ if len(model) else "none"
            raise ValueError(f"MoCoSELoss reads text, but this SentenceTransformer has no tokenizer (first module: {first}). "
                             "Build it around a transformers encoder: SentenceTransformer(modules=[Transformer(...), Pooling(...)]).")
        if queue_init_size is None:
            queue_init_size = min(128, max(queue_size, 0))
        self.settings = dict(
            queue_size=queue_size, queue_init_size=queue_init_size, ema_decay=ema_decay, ema_decay_end=ema_decay_end,
            ema_decay_horizon=ema_decay_horizon, temperature=temperature, in_batch_negatives=in_batch_negatives,
            projection_layers=projection_layers, predictor_layers=predictor_layers, predictor_dim=predictor_dim,
            head_dropout=head_dropout, head_init=head_init, target_dropout=target_dropout, fgsm_mode=fgsm_mode,
            fgsm_epsilon=fgsm_epsilon, fgsm_views=fgsm_views, fgsm_epsilon_unit=fgsm_epsilon_unit,
        )
        validate_method_hparams({k: self.settings[k] for k in ("queue_size", "queue_init_size", "projection_layers",
                                                                "predictor_layers", "predictor_dim", "head_dropout", "head_init")})
        if not temperature > 0:
            raise ValueError(f"temperature (tau) must be > 0, got {temperature!r}.")
        validate_ema_decay(ema_decay, ema_decay_end, ema_decay_horizon, names=("ema_decay", "ema_decay_end"))
        _check_unsharded()  # an `accelerate launch` with FSDP fails inside prepare(), before begin_training
        self.fgsm = FGSMPerturbation(fgsm_mode, fgsm_epsilon, fgsm_views, fgsm_epsilon_unit)
        if self.fgsm.mode != "off":
            _word_embeddings(model)
        hidden = model.get_embedding_dimension()
        if not hidden:
            raise ValueError("MoCoSELoss could not read the model's embedding dimension (get_embedding_dimension() is None).")
        self.temperature, self.in_batch_negatives, self.target_dropout = temperature, in_batch_negatives, target_dropout

        self.model = model
        self.online_head = nn.Sequential(OrderedDict(
            pooler=head_linear(hidden, hidden, head_init),
            projection=build_projection(hidden, projection_layers, head_dropout, head_init),
            predictor=build_predictor(hidden, predictor_layers, predictor_dim, head_dropout, head_init),
        ))
        std = getattr(getattr(model.transformers_model, "config", None), "initializer_range", 0.02)
        self.online_head.apply(partial(init_head_weights, std=std))
        self.target_encoder = copy.deepcopy(model).requires_grad_(False)
        self.target_head = copy.deepcopy(self.online_head[:2]).requires_grad_(False)  # pooler + projection
        self.queue = KeyQueue(queue_size, hidden, queue_init_size)
        self.callback = MoCoSELossCallback(self)
        self._distributed_head: DistributedDataParallel | None = None
        self._ready = False
        self._restored: dict[str, Any] | None = None

    # ----------------------------------------------------------------- sentence-transformers protocol
    def get_config_dict(self) -> dict[str, Any]:
        """The settings, as the model card shows them."""
        return dict(self.settings)

    @property
    def citation(self) -> str:
        from .model_card import CITATIONS

        return CITATIONS["mocose"]

    def ema_parameter_pairs(self) -> EMATensorPairs:
        """Online tensors (model, pooler, projection) and their target copies, for `EMATargetCallback`."""
        online = (_unwrap(self.model), self.online_head.pooler, self.online_head.projection)
        target = (self.target_encoder, self.target_head.pooler, self.target_head.projection)
        return ema_tensor_pairs(zip(online, target))

    # ----------------------------------------------------------------- loss
    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        """InfoNCE of the online queries against their target keys, the global batch's other keys and the queue.

        Args:
            sentence_features: one feature dict (`input_ids` `(B, L)`, `attention_mask`, ...) per text
                column: the sentences, or the anchors and their positives.
            labels: must be None: MoCoSE learns from the text alone.

        Returns:
            The scalar loss. In training, the step's keys `(B x processes, D)` are then enqueued.
        """
        training = _unwrap(self.model).training
        if training and not self._ready:
            self._attach(_calling_trainer())  # checks the data first, so its errors name the columns
        features = list(sentence_features)
        if labels is not None or len(features) not in (1, 2):
            raise ValueError(f"MoCoSELoss takes one text column (sentences) or two ((anchor, positive) pairs) and no "
                             f"labels; got {len(features)} text column(s){' and labels' if labels is not None else ''}.")
        self.online_head.train(training)
        self.target_encoder.train(training and self.target_dropout)
        self.target_head.train(training and self.target_dropout)
        anchor, positive = features[0], features[-1]
        perturbation = self._fgsm_perturbation(anchor, positive) if training else None
        head = self._distributed_head if training and self._distributed_head is not None else self.online_head
        query, words = self._queries(self.model, head, anchor, perturbation)
        if training:
            self.fgsm.track(words)
        same_input = len(features) == 1 and self.fgsm.perturb_target  # the target reads the perturbed anchor too
        result, keys = self._contrast(query, self._keys(positive, perturbation if same_input else None))
        if training:  # after the loss: it never sees its own keys
            self.queue.enqueue(keys)
        return result.loss

    def _queries(self, model: nn.Module, head: nn.Module, features: dict, perturbation: Tensor | None):
        """`(B, D)` queries, and the `(B, L, H)` word embeddings they came from (None when FGSM is off)."""
        with self._perturbed(_unwrap(self.model), perturbation) as captured:
            embeddings = model(dict(features))["sentence_embedding"]  # a copy: modules write into the dict
        return head(embeddings), captured.get("words")

    @torch.no_grad()
    def _keys(self, features: dict, perturbation: Tensor | None) -> Tensor:
        """`(B, D)` target keys."""
        with self._perturbed(self.target_encoder, perturbation):
            return self.target_head(self.target_encoder(dict(features))["sentence_embedding"])

    @contextmanager
    def _perturbed(self, encoder: SentenceTransformer, perturbation: Tensor | None):
        """While the block runs, adds `perturbation` `(B, L, H)` to the encoder's word embeddings and
        keeps them in the yielded dict under "words" (for FGSM's gradient); with FGSM off, does nothing."""
        captured: dict[str, Tensor] = {}

        def hook(module, inputs, output):
            captured["words"] = output if perturbation is None else output + perturbation
            return captured["words"]

        handle = _word_embeddings(encoder).register_forward_hook(hook) if self.fgsm.mode != "off" else None
        try:
            yield captured
        finally:
            if handle is not None:
                handle.remove()

    def _fgsm_perturbation(self, anchor: dict, positive: dict) -> Tensor | None:
        if self.fgsm.mode == "previous":
            width = _word_embeddings(_unwrap(self.model)).weight.shape[1]
            return self.fgsm.previous_perturbation(torch.Size((*anchor["input_ids"].shape, width)))
        if self.fgsm.mode == "exact":
            # Extra pass on the unwrapped modules: autograd.grad reaches only the embeddings, so DDP's hooks never fire.
            query, words = self._queries(_unwrap(self.model), self.online_head, anchor, None)
            clean, _ = self._contrast(query, self._keys(positive, None))
            (gradient,) = torch.autograd.grad(clean.loss, words)
            return self.fgsm.step(gradient, words)
        return None

    def _contrast(self, query: Tensor, key: Tensor) -> tuple[ContrastiveLossOutput, Tensor]:
        """InfoNCE of `(B, D)` queries; returns it with the keys of all processes `(B x processes, D)`, in rank order."""
        rank, world = _rank_and_world()
        keys = all_gather(key.contiguous()) if world > 1 else key
        positive_index, candidates = None, key
        if self.in_batch_negatives:
            positive_index = torch.arange(key.shape[0], device=key.device) + rank * key.shape[0]
            candidates = keys
        result = info_nce_loss(query, candidates, self.temperature, positive_index=positive_index,
                               extra_negatives=self.queue.keys, extra_negative_weights=self.queue.negative_weights())
        return result, keys

    # ----------------------------------------------------------------- the training run
    def _attach(self, trainer: Trainer | None) -> None:
        if trainer is None:
            raise RuntimeError("MoCoSELoss trains under a transformers Trainer (e.g. SentenceTransformerTrainer), whose "
                               "callback `loss.callback` runs the EMA target update and checkpoints the loss state; no "
                               "Trainer is calling this loss.")
        if self.callback not in trainer.callback_handler.callbacks:
            trainer.add_callback(self.callback)
        self.begin_training(trainer.args, trainer.state, trainer.train_dataset)

    def begin_training(self, args, state, dataset=None) -> None:
        """Checks the data against the settings, restores a resumed run's state and puts the processes in step.

        Run by the callback at `on_train_begin` (or by the loss at its first training step).
        """
        _check_unsharded()
        for part in _parts(dataset):
            self.check_dataset(part, args)
        if state.global_step > 0:
            if self._restored is None:
                checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
                if not (checkpoint / LOSS_STATE_DIR / STATE_FILE).is_file():
                    raise FileNotFoundError(
                        f"Resuming at step {state.global_step}, but {checkpoint / LOSS_STATE_DIR} holds no MoCoSELoss state "
                        "(target, heads, queue). For a checkpoint outside output_dir, call loss.load_state(CHECKPOINT) "
                        "before trainer.train(resume_from_checkpoint=CHECKPOINT).")
                self.load_state(checkpoint)
            saved, current = self._restored["fingerprint"], self._fingerprint()
            if saved.shape != current.shape or not torch.allclose(saved, current, rtol=1e-7, atol=0.0):
                raise ValueError(f"The MoCoSELoss state in {self._restored['folder']} was saved with other model weights "
                                 f"than the checkpoint resumed at step {state.global_step}: load that checkpoint's own.")
        self._restored = None
        if _rank_and_world()[1] > 1:
            self._start_distributed()
        self._ready = True

    def check_dataset(self, dataset, args=None) -> None:
        """Raises a `ValueError` naming what does not fit: label or non-text columns, not one or two text
        columns, a queue larger than the data, batches that differ between processes."""
        columns = [c for c in getattr(dataset, "column_names", None) or [] if c != "dataset_name"]
        if not columns:
            return  # not a `datasets` table: nothing to read before the first batch
        labels = [c for c in columns if c in LABEL_COLUMNS]
        if labels:
            raise ValueError(f"MoCoSELoss learns from text alone, but the training data has the label column {labels[0]!r}: "
                             f"drop it (dataset.remove_columns({labels!r})).")
        features = getattr(dataset, "features", None) or {}
        for column in columns:
            dtype = getattr(features.get(column), "dtype", None)
            if column in features and dtype not in ("string", "large_string"):
                raise ValueError(f"MoCoSELoss takes text columns only, but column {column!r} holds {features[column]}.")
        if len(columns) > 2:
            raise ValueError(f"MoCoSELoss takes one text column (sentences) or two ((anchor, positive) pairs), but the "
                             f"training data has {len(columns)}: {columns}. Keep them with dataset.select_columns([...]).")
        rows = len(dataset) if hasattr(dataset, "__len__") else None
        if rows is not None and self.queue.capacity > rows:
            raise ValueError(f"queue_size={self.queue.capacity} is larger than the training data ({rows} rows): the queue would "
                             f"hold several keys of one sentence, an anchor's own earlier key among its negatives. "
                             f"Use queue_size <= {rows}.")
        world = _rank_and_world()[1]
        if rows is not None and args is not None and world > 1 and not args.dataloader_drop_last:
            per_step = args.per_device_train_batch_size * world
            if rows % per_step:
                raise ValueError(f"Under {world} processes every rank must hold the same number of keys at each step, but "
                                 f"{rows} rows leave a last batch short of {per_step}: set dataloader_drop_last=True.")

    def _start_distributed(self) -> None:
        """DDP over the online heads (their gradients are averaged like the model's, which the Trainer wraps
        alone) and rank 0's target and queue on every process."""
        if self._distributed_head is None:
            device = self.online_head.pooler.weight.device
            ddp = DistributedDataParallel(self.online_head, device_ids=[device.index] if device.type == "cuda" else None)
            object.__setattr__(self, "_distributed_head", ddp)  # not a sub-module: no second copy in state_dict()
        for module in (self.target_encoder, self.target_head, self.queue):
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

    # ----------------------------------------------------------------- checkpoints
    def _fingerprint(self) -> Tensor:
        """`(P,)` float64 sums of the model's parameters: ties a saved loss state to the model weights of its checkpoint."""
        return torch.stack([p.detach().double().sum() for p in _unwrap(self.model).parameters()]).cpu()

    def save_state(self, checkpoint: str | Path, args=None) -> None:
        """Writes the loss state into `checkpoint/mocose_loss/`: `state.pt` (online heads, target encoder and
        head, queue with pointer and fill, last EMA decay; by the main process) and, for FGSM "previous",
        each process's last gradient sign (`fgsm_rank{r}.pt`)."""
        folder = Path(checkpoint) / LOSS_STATE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        rank = args.process_index if args is not None else _rank_and_world()[0]
        if (args.should_save if args is not None else rank == 0):
            torch.save({
                "online_head": self.online_head.state_dict(), "target_encoder": self.target_encoder.state_dict(),
                "target_head": self.target_head.state_dict(), "queue": self.queue.state_dict(),
                "ema_last_decay": self.callback.last_decay, "fingerprint": self._fingerprint(),
            }, folder / STATE_FILE)
        if self.fgsm.mode == "previous":
            torch.save(self.fgsm.state_dict(), folder / FGSM_STATE_FILE.format(rank=rank))

    def load_state(self, checkpoint: str | Path) -> None:
        """Reads what `save_state` wrote. Within `output_dir` a resumed run does this itself; call it before
        `trainer.train(resume_from_checkpoint=checkpoint)` for a checkpoint elsewhere."""
        folder = Path(checkpoint) / LOSS_STATE_DIR
        if not (folder / STATE_FILE).is_file():
            raise FileNotFoundError(f"{folder / STATE_FILE} does not exist: {checkpoint} holds no MoCoSELoss state.")
        device = self.queue.keys.device
        state = torch.load(folder / STATE_FILE, map_location=device, weights_only=True)
        for name in ("online_head", "target_encoder", "target_head", "queue"):
            getattr(self, name).load_state_dict(state[name])
        self.callback.last_decay = state["ema_last_decay"]
        fgsm_file = folder / FGSM_STATE_FILE.format(rank=_rank_and_world()[0])
        if self.fgsm.mode == "previous" and fgsm_file.is_file():
            self.fgsm.load_state_dict(torch.load(fgsm_file, map_location=device, weights_only=True))
        self._restored = {"folder": folder, "fingerprint": state["fingerprint"]}  # checked in begin_training
