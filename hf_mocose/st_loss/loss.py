"""`MoCoSELoss`: MoCoSE as a sentence-transformers loss, an adapter over `models.objective.ContrastiveObjective`."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel, has_compiled_regions
from sentence_transformers import SentenceTransformer
from torch import Tensor, nn

from ..augmentation.views import repeat_words_in_batch
from ..compat import get_rank
from ..models.configuration import MODEL_CONFIG_FIELDS, MoCoSEConfig
from ..models.branches import ContrastiveBranches, Encoders
from ..models.ema import EMATensorPairs
from ..models.heads import init_head_weights
from ..models.objective import ContrastiveObjective, FGSMPerturbation, check_matryoshka_width
from ..models.settings import LOSS_SETTINGS, METHOD_DEFAULTS, SETTINGS, take_settings, with_keywords
from ..launch.precision import AutocastState, recorded_autocast
from .callback import MoCoSELossCallback
from .checkpoints import load_loss_state, save_loss_state
from .inputs import check_training_data
from .distributed import refuse_sharded_loss_launch

# Names this loss took before it shared MoCoSETrainingArguments' vocabulary (0.1: refused, not aliased).
RENAMED_ARGUMENTS = {"ema_decay": "ema_decay_start", "temperature": "contrastive_temperature"}
# Method switches whose inputs a sentence-transformers dataset cannot carry (UNA's hard negatives come from
# MoCoSETrainer's collator, IFCL's fraternal view from a second vocabulary) or that only it implements.
TRAINER_ONLY = ("hard_negatives", "una_usage", "una_alpha", "una_window", "una_frequency", "queue_slice", "target_mtd",
                "token_shuffle", "token_cutoff", "feature_cutoff", "augmentation_views", "fraternal_model_name_or_path")


def _unwrap(module: nn.Module) -> nn.Module:  # the module inside DDP / DataParallel / torch.compile wrappers
    return extract_model_from_parallel(module, keep_torch_compile=False)


def _word_embeddings(model: SentenceTransformer) -> nn.Module:
    """The word-embedding module of the model's transformers encoder (where FGSM adds its perturbation)."""
    transformer = model.transformers_model
    embeddings = transformer.get_input_embeddings() if hasattr(transformer, "get_input_embeddings") else None
    if embeddings is None:
        raise ValueError(f"FGSM perturbs word embeddings, but this SentenceTransformer's first module "
                         f"({type(model[0]).__name__}) has no transformers encoder with input embeddings: set fgsm_mode='off'.")
    return embeddings


class MoCoSELoss(nn.Module):
    r"""MoCoSE for any `SentenceTransformer`: an EMA target encoder, a predictor on the online branch and a
    queue of past target keys as extra negatives, with FGSM on the anchor's word embeddings.

    ::

        online:  anchor   -> model (its own modules, pooling) -> pooler -> projection -> predictor = query  (optimised)
        target:  positive -> EMA copy of the model            -> EMA pooler -> EMA projection      = key    (EMA only)

    The positive is the sentence itself (one text column) or the second column of (anchor, positive) pairs.
    Its negatives are the queue, with `in_batch_negatives` the other keys of the global batch, and the hard negatives
    of (anchor, positive, negative_1, ..., negative_n) rows: encoded like keys, every anchor sees those of the whole
    global batch (as supervised SimCSE and `MultipleNegativesRankingLoss`); they never enter the queue. The
    trainer saves the model with its own pooling; heads, target and queue go into each checkpoint's
    `mocose_loss/` folder. `method="simcse"`, `"ifcl"` (without the fraternal view) and `"esimcse"` run here too,
    and `word_repetition_rate` repeats words of the positive column's tokens; what only `MoCoSETrainer` has (UNA, the fraternal view, the ablation switches) is refused in one line.

    Args:
        model: the `SentenceTransformer` to train; its first module is a transformers encoder with a tokenizer.
        **settings: the method settings, with the names, defaults and help of the `MoCoSETrainingArguments`
            fields (`hf_mocose.models.settings.LOSS_SETTINGS`; `inspect.signature(MoCoSELoss)` lists them).

    References:
        * Cao et al., Findings of ACL 2022 (MoCoSE); docs/sentence_transformers.md, docs/methods.md

    Requirements:
        1. `SentenceTransformerTrainer(..., loss=loss, callbacks=[loss.callback])`: the callback moves the
           EMA target, clips the heads with the model and checkpoints the loss state.
        2. No labels; `queue_size` at most the number of training rows.
        3. Several processes: DDP (not FSDP or DeepSpeed), `dataloader_drop_last=True`; not fp16 with
           `max_grad_norm > 0` (bf16 works).

    Inputs:
        | Texts | Labels |
        | --- | --- |
        | single sentences, (anchor, positive) pairs, or (anchor, positive, negative_1, ..., negative_n) | none |

    Relations:
        * `MoCoSETrainer` trains the same method on a `MoCoSEModel`; both run `ContrastiveObjective`.
        * Like `MultipleNegativesRankingLoss` with more negatives than a batch holds, from a slowly moving target.

    Example:
        ::

            loss = MoCoSELoss(model, queue_size=512, ema_decay_start=0.75, contrastive_temperature=0.05)
            trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset,
                                                 loss=loss, callbacks=[loss.callback])
    """

    @with_keywords(LOSS_SETTINGS, more=False)  # any other keyword is refused
    def __init__(self, model: SentenceTransformer, **settings):
        super().__init__()
        if name := next((name for name in settings if name not in METHOD_DEFAULTS), None):
            if name in RENAMED_ARGUMENTS:
                raise TypeError(f"MoCoSELoss: {name}= is now {RENAMED_ARGUMENTS[name]}= (the MoCoSETrainingArguments "
                                "name).")
            if name in SETTINGS or name in TRAINER_ONLY:
                raise TypeError(f"MoCoSELoss does not take {name}=: it is a setting of MoCoSETrainer "
                                f"(MoCoSETrainingArguments.{name}), the front end that has it.")
            raise TypeError(f"MoCoSELoss got an unexpected keyword argument {name!r}.")
        self.settings = take_settings(settings, LOSS_SETTINGS)  # defaults filled in, queue_init_size resolved, validated
        self.model = model
        self._bind(model)
        self.callback = MoCoSELossCallback(self)

    def _bind(self, model: SentenceTransformer) -> None:
        """Builds everything that belongs to `model`: heads, EMA target, queue, FGSM state (and re-points the
        callback's EMA pairs). Runs at construction and whenever `loss.model` becomes another model, e.g.
        sentence-transformers' `model_init` (one new model per hyperparameter-search trial)."""
        if not isinstance(model, SentenceTransformer):
            raise TypeError(f"MoCoSELoss trains a sentence_transformers.SentenceTransformer, got {type(model).__name__}.")
        if len(model) == 0 or getattr(model[0], "tokenizer", None) is None:
            first = type(model[0]).__name__ if len(model) else "none"
            raise ValueError(f"MoCoSELoss reads text, but this SentenceTransformer has no tokenizer (first module: "
                             f"{first}). Build it around a transformers encoder: "
                             "SentenceTransformer(modules=[Transformer(...), Pooling(...)]).")
        s = self.settings
        refuse_sharded_loss_launch()  # an `accelerate launch` with FSDP fails inside prepare(), before any loss hook
        config = MoCoSEConfig(**{k: v for k, v in s.items() if k in MODEL_CONFIG_FIELDS})
        if not (hidden := model.get_embedding_dimension()):
            raise ValueError("MoCoSELoss could not read the model's embedding dimension (get_embedding_dimension() is None).")
        self.objective = ContrastiveObjective.from_settings(config, s, key_dim=hidden, embedding_dim=hidden)
        if self.fgsm.mode != "off":
            _word_embeddings(model)
        self.__dict__["_bound_model"] = model  # a plain reference: not a second sub-module
        std = getattr(getattr(model.transformers_model, "config", None), "initializer_range", 0.02)
        branches = ContrastiveBranches.build(config, hidden, partial(copy.deepcopy, model), key_dim=hidden,
                                             init_online_heads=lambda m: m.apply(partial(init_head_weights, std=std)))
        heads = OrderedDict(pooler=branches.pooler, projection=branches.projection, predictor=branches.predictor)
        self.online_head = nn.Sequential(OrderedDict((k, m) for k, m in heads.items() if m is not None))
        self.target_head = None if branches.target_pooler is None else nn.Sequential(
            OrderedDict(pooler=branches.target_pooler, projection=branches.target_projection))
        self.target_encoder, self.queue = branches.target_encoder, branches.queue
        self._ready = False  # set by the callback at on_train_begin
        self._restored: dict[str, Any] | None = None  # what load_state read, checked at on_train_begin
        if "callback" in self.__dict__:
            self.callback.bind(self)

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        # sentence-transformers sets `loss.model` to the DDP-wrapped model (same model) and, with `model_init`,
        # to a new one, whose heads, target and queue must be new too.
        if name == "model" and "_bound_model" in self.__dict__ and _unwrap(value) is not self._bound_model:
            self._bind(_unwrap(value))

    @property
    def fgsm(self) -> FGSMPerturbation:
        """FGSM's settings and its "previous" gradient sign (checkpointed per process)."""
        return self.objective.fgsm

    @property
    def online_model(self) -> SentenceTransformer:
        """The model being trained, without DDP / compile wrappers."""
        return _unwrap(self.model)

    def move_to_model_device(self) -> None:
        """Heads, target and queue onto the model's device (a model from `model_init` is moved after it is bound)."""
        device = next(self.online_model.parameters()).device
        for module in self.state_modules().values():
            module.to(device)

    def state_modules(self) -> dict[str, nn.Module]:
        """What this loss trains or keeps beside the model, by name: the online heads and, as the method has
        them, the EMA target (encoder and heads) and the queue. Checkpoints save and restore these."""
        names = ("online_head", "target_encoder", "target_head", "queue")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    # ----------------------------------------------------------------- sentence-transformers protocol
    # `MatryoshkaLoss(model, MoCoSELoss(model), dims)`: a loss that says it caches gradients gets, instead of a
    # truncated `model.forward` (which would cut the online embedding only, before the heads, and neither the target
    # keys nor the queue), its `calculate_loss` wrapped in a decorator that carries the dims and weights; this loss
    # reads them from there and runs its own Matryoshka objective, the same as `matryoshka_dims=dims`.
    uses_gradient_cache = True

    def calculate_loss(self, *args, **kwargs):
        raise NotImplementedError("MoCoSELoss computes its loss in forward(); calculate_loss is where "
                                  "sentence-transformers' MatryoshkaLoss leaves its dimensions.")

    def adopt_matryoshka_wrapper(self) -> None:
        """Takes the dimensions of a wrapping `MatryoshkaLoss` (its decorator on `calculate_loss`), if any, as
        `matryoshka_dims` / `matryoshka_weights`; refuses what it cannot run the same way. Idempotent."""
        decorator = self.__dict__.get("calculate_loss")
        if decorator is None or self.__dict__.get("_adopted") is decorator:
            return
        dims, weights = list(decorator.matryoshka_dims), [float(w) for w in decorator.matryoshka_weights]
        if getattr(decorator, "n_dims_per_step", -1) not in (-1, 0, None) and decorator.n_dims_per_step < len(dims):
            raise ValueError(f"MatryoshkaLoss(n_dims_per_step={decorator.n_dims_per_step}) around MoCoSELoss: the queue "
                             "and target keys serve every dimension each step; use MoCoSELoss(model, matryoshka_dims="
                             f"{dims}) (or n_dims_per_step=-1).")
        own = self.settings["matryoshka_dims"]
        if own is not None and list(own) != dims:
            raise ValueError(f"MoCoSELoss(matryoshka_dims={list(own)}) inside MatryoshkaLoss(matryoshka_dims={dims}): "
                             "give the dimensions once, as MoCoSELoss(model, matryoshka_dims=...).")
        take_settings({"matryoshka_dims": dims, "matryoshka_weights": weights}, LOSS_SETTINGS)  # the same checks
        hidden = self.online_model.get_embedding_dimension()
        check_matryoshka_width(dims, hidden, hidden)
        self.settings.update(matryoshka_dims=dims, matryoshka_weights=weights)
        self.objective.matryoshka_dims, self.objective.matryoshka_weights = tuple(dims), tuple(weights)
        self.__dict__["_adopted"] = decorator

    def get_config_dict(self) -> dict[str, Any]:
        """The settings, as the model card shows them."""
        return dict(self.settings)

    @property
    def citation(self) -> str:
        from ..publishing.model_card import CITATIONS

        return CITATIONS["mocose"] + ("\n" + CITATIONS["esimcse"] if self.objective.config.method == "esimcse" else "")

    @property
    def branches(self) -> ContrastiveBranches:
        """The heads, target and queue as `ContrastiveBranches` (a view of this loss's modules)."""
        head, target = self.online_head, self.target_head
        return ContrastiveBranches(self.objective.config, head.pooler, head.projection, head._modules.get("predictor"),
                                   self.target_encoder, None if target is None else target.pooler,
                                   None if target is None else target.projection, self.queue)

    def ema_parameter_pairs(self) -> EMATensorPairs:
        """Online tensors (model, pooler, projection) and their target copies, for `EMATargetCallback`."""
        return self.branches.ema_parameter_pairs(self.online_model)

    # ----------------------------------------------------------------- loss
    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        """InfoNCE of the online queries against their target keys, the global batch's other keys and the queue.

        Args:
            sentence_features: one feature dict (`input_ids` `(B, L)`, `attention_mask`, ...) per text
                column: the sentences; or the anchors, their positives and any hard negatives.
            labels: must be None: MoCoSE learns from the text alone.

        Returns:
            The scalar loss. In training, the step's keys `(B x processes, D)` are then enqueued.
        """
        training = self.online_model.training
        if training and not self._ready:
            raise RuntimeError("MoCoSELoss is training without its callback, which moves the EMA target, clips the heads "
                               "with the model and checkpoints the loss state: pass callbacks=[loss.callback] to "
                               "SentenceTransformerTrainer(...).")
        self.adopt_matryoshka_wrapper()
        if hasattr(self.online_model.__dict__.get("forward"), "set_dim"):  # sentence-transformers < 6's wrapper
            raise ValueError("This sentence-transformers' MatryoshkaLoss cuts the model's output before MoCoSELoss's "
                             "heads, and neither its target keys nor its queue: use MoCoSELoss(model, matryoshka_dims="
                             "[...]) without the wrapper (sentence-transformers >= 6 runs the wrapper the same way).")
        features = list(sentence_features)
        if labels is not None:
            raise ValueError("MoCoSELoss learns from the text alone: its training data has no labels (got labels).")
        branches = self.branches
        branches.set_training(training)
        anchor, positive, negatives = features[0], features[min(1, len(features) - 1)], features[2:]
        rate = self.settings["word_repetition_rate"]
        if training and rate:  # ESimCSE's word repetition of the positive (`augmentation.views.repeat_words`)
            positive = repeat_words_in_batch(positive, rate, None, self.online_model.tokenizer.pad_token_id or 0)
        if len(features) == 1 and not (training and rate):
            positive = None  # the key reads the anchor itself (and FGSM's delta with fgsm_views="both")
        queue, autocast, perturbation = self.queue, SimpleNamespace(state=AutocastState()), None
        if training and self.fgsm.mode != "off":
            probe = (branches.forward(self._encoders(self.online_model, autocast), anchor, positive)
                     if self.fgsm.mode == "exact" else None)  # on the unwrapped model: no DDP hooks for the probe
            shape = (*anchor["input_ids"].shape, _word_embeddings(self.online_model).weight.shape[1])
            perturbation = self.objective.perturbation(torch.Size(shape), probe, queue)
        encoders = self._encoders(self.model, autocast)
        outputs = branches.forward(encoders, anchor, positive, perturbation, self.fgsm.perturb_target)
        if negatives:  # each column's keys `(B, D)`, stacked `(B x n, D)`: as `MoCoSEModel`'s `negative_*` inputs
            outputs.negative_keys = torch.cat([branches.key(encoders, column) for column in negatives])
        result = self.objective(outputs, queue, training)
        if training:
            self.callback.head_gradients.watch(result.loss, self.online_model, self.online_head)
        return result.loss

    def _encoders(self, model: nn.Module, autocast: SimpleNamespace) -> Encoders:
        """The `Encoders` of `ContrastiveBranches`: feature dicts through `model` (the online one, wrapped or not) and
        the target; the target runs under the autocast the online forward ran under (accelerate's, for `bf16=True`),
        recorded into `autocast.state`, while its weights stay fp32."""
        # compiled whole or in regions (accelerate's regional compilation); walked once per step, and only for FGSM
        compiled = self.fgsm.mode != "off" and has_compiled_regions(model)

        def online(features: dict, perturbation: Tensor | None):
            features = dict(features)  # a copy: modules write into the dict
            with self._perturbed(self.online_model, perturbation, features if compiled else None) as captured, \
                    recorded_autocast(self.online_model[0]) as recording:
                state = model(features)["sentence_embedding"]
            autocast.state = recording["state"]
            return state, captured.get("words")

        def target(features: dict, perturbation: Tensor | None):
            with self._perturbed(self.target_encoder, perturbation):
                return self.target_encoder(dict(features))["sentence_embedding"], None
        return Encoders(online, online, target, target, target_context=lambda: autocast.state.context())

    @contextmanager
    def _perturbed(self, encoder: SentenceTransformer, perturbation: Tensor | None, features: dict | None = None):
        """While the block runs, adds `perturbation` `(B, L, H)` to the encoder's word embeddings and
        keeps them in the yielded dict under "words" (for FGSM's gradient); with FGSM off, does nothing.
        Given the `features` of a compiled model, looks them up here instead, as its `inputs_embeds`: a compiled
        graph gives gradients to its inputs only (torch_compile, or accelerate's dynamo_backend)."""
        captured: dict[str, Tensor] = {}

        def perturbed(words: Tensor) -> Tensor:
            captured["words"] = words if perturbation is None else words + perturbation.to(words.dtype)
            return captured["words"]

        if features is not None:  # (given for FGSM only)
            features["inputs_embeds"] = perturbed(_word_embeddings(encoder)(features.pop("input_ids")))
            yield captured
            return
        # torch's hook handle is a context manager: it removes the hook when the block ends, however it ends
        with (_word_embeddings(encoder).register_forward_hook(lambda module, inputs, output: perturbed(output))
              if self.fgsm.mode != "off" else nullcontext()):
            yield captured

    # ----------------------------------------------------------------- data and checkpoints
    def check_dataset(self, dataset, args=None) -> None:
        """Raises a `ValueError` naming what in `dataset` does not fit this loss (`check_training_data`)."""
        check_training_data(self, dataset, args)

    def save_state(self, checkpoint: str | Path, args=None) -> None:
        """Writes the loss state into `checkpoint/mocose_loss/` (`st_loss.checkpoints`); the callback does
        this for every checkpoint of a run."""
        rank = args.process_index if args is not None else get_rank()
        save_loss_state(self, checkpoint, rank, args.should_save if args is not None else rank == 0)

    def load_state(self, checkpoint: str | Path) -> None:
        """Reads what `save_state` wrote. Within the run's folder a resumed run does this itself; call it before
        `trainer.train(resume_from_checkpoint=checkpoint)` for a checkpoint elsewhere (e.g. one from the Hub)."""
        self._restored = load_loss_state(self, checkpoint, get_rank())  # checked at on_train_begin
