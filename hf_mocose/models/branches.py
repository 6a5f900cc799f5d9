"""The branches of every method, built and run in one place for both front ends: moco's `MoCo(base_encoder)`.

    query:   anchor (+ FGSM delta) -> online encoder -> state (B, H) -> pooler -> projection [-> predictor]
    key:     mocose: positive -> EMA target encoder -> target pooler -> target projection          (no gradient)
             simcse, ifcl, esimcse: positive -> online encoder again (a second dropout view) -> pooler -> projection
    queued:  esimcse: anchor -> EMA target encoder -> the online pooler and projection (momentum embeddings)

The positive is the anchor itself unless the batch gives one (a paraphrase, ESimCSE's word-repeated copy); the
key sees FGSM's delta only when it reads the anchor itself and `perturb_target` is set.

`ContrastiveBranches.build` makes a method's heads, EMA target and queue, which each front end keeps under the
names of its saved state, and the front end supplies its `Encoders`: transformers encoders reading word embeddings
(`MoCoSEModel`), or a `SentenceTransformer` whose word embeddings a hook perturbs (`MoCoSELoss`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from transformers.utils import ModelOutput

from .ema import EMATensorPairs, ema_tensor_pairs
from .heads import build_predictor, build_projection, head_linear
from .queue import KeyQueue


@dataclass
class MoCoSEOutput(ModelOutput):
    """The forward's output, as `ContrastiveObjective` reads it (both front ends).

    Attributes:
        query: `(B, D)` online branch output (after the predictor), with gradient.
        key: `(B, D)` target branch output (detached) for "mocose"; the second dropout view (with gradient) else.
        word_embeddings: `(B, L, H)` the online word embeddings, FGSM perturbation added (None without FGSM under
            `MoCoSELoss`).
        negative_keys / negative_queries: `(U, D)` hard negatives through the key / query branch (UNA), or None.
        target_embedding: `(B, D)` ESimCSE's momentum-encoder embeddings of the anchors (the queue's), or None.
        fraternal_query: `(B, D)` IFCL's fraternal view, or None.
        input_embeddings: `(2, B, H)` mean input embeddings of the anchor and the fraternal view (Twins), or None.
        fgsm_gradient_at: `(B, L, H)` where FGSM reads the gradient (`word_embeddings` or the caller's
            `inputs_embeds`: a compiled module gives gradients to its inputs only).
    """

    query: Tensor | None = None
    key: Tensor | None = None
    word_embeddings: Tensor | None = None
    negative_keys: Tensor | None = None
    target_embedding: Tensor | None = None
    fraternal_query: Tensor | None = None
    input_embeddings: Tensor | None = None
    negative_queries: Tensor | None = None
    fgsm_gradient_at: Tensor | None = None


# encode(inputs, perturbation (B, L, H) or None) -> (state (B, H), the word embeddings (B, L, H) it read, or None).
# `inputs` is the front end's: (word embeddings, attention mask, token types) or a sentence-transformers feature dict.
Encode = Callable[[Any, Tensor | None], tuple[Tensor, Tensor | None]]


class Encoders(NamedTuple):
    """The front end's encoders, one per use (they differ in `MoCoSEModel`'s view augmentations only)."""

    online_query: Encode
    online_key: Encode  # the second dropout view of the methods without target keys
    target_key: Encode | None = None  # run under no_grad, inside `target_context`
    target_anchor: Encode | None = None  # ESimCSE's momentum embedding of the anchor, likewise
    target_context: Callable[[], Any] = nullcontext  # the autocast the target runs under (`MoCoSELoss`)


@dataclass(eq=False)
class ContrastiveBranches:
    """A method's heads, EMA target and queue, and the forward from encoder states to queries and keys.

    `config` is what the method is (a `MoCoSEConfig`: `keys_from_target`, `uses_target`, `uses_queue`,
    `queues_target_embeddings`, `target_dropout`, the head and queue sizes)."""

    config: Any
    pooler: nn.Linear
    projection: nn.Sequential
    predictor: nn.Sequential | None = None
    target_encoder: nn.Module | None = None
    target_pooler: nn.Linear | None = None
    target_projection: nn.Sequential | None = None
    queue: KeyQueue | None = None

    @classmethod
    def build(cls, config, hidden: int, make_target_encoder: Callable[[], nn.Module],
              init_online_heads: Callable[[nn.Module], None] | None = None,
              key_dim: int | None = None) -> "ContrastiveBranches":
        """The branches of `config.method` on an encoder of width `hidden`: heads (keys, queries and queue of width
        `key_dim`, default `config.key_dim`), the target encoder from `make_target_encoder()` (frozen), the queue.

        `init_online_heads` initialises the online heads at once and the target heads are copies of them
        (`MoCoSELoss`); without it the caller initialises every module later and copies online to target
        (`MoCoSEModel.post_init`). Each front end keeps the order of random draws it has always had, which the
        golden trajectories (tests/test_golden_trajectories.py) hold bit for bit."""
        key_dim, dropout, init = key_dim or config.key_dim, config.head_dropout, config.head_init

        def pooler_and_projection() -> list[nn.Module]:
            return [head_linear(hidden, hidden, init), build_projection(hidden, config.projection_layers, dropout,
                                                                        init, key_dim)]
        online = pooler_and_projection()
        if config.keys_from_target:  # the predictor sits on the online branch of a method with target keys only
            online.append(build_predictor(key_dim, config.predictor_layers, config.predictor_dim, dropout, init))
        for module in online if init_online_heads is not None else ():
            init_online_heads(module)
        # ESimCSE's momentum encoder is an encoder only: it shares the online heads (the authors' code).
        target = make_target_encoder() if config.uses_target else None
        target_heads = [None, None] if not config.keys_from_target else (
            pooler_and_projection() if init_online_heads is None else [copy.deepcopy(m) for m in online[:2]])
        queue = KeyQueue(config.queue_size, key_dim, config.queue_init_size) if config.uses_queue else None
        branches = cls(config, *online, *[None] * (3 - len(online)), target, *target_heads, queue)
        for module in branches.target_modules():
            module.requires_grad_(False)
        return branches

    # ----------------------------------------------------------------- modules
    def online_heads(self) -> list[nn.Module]:
        """Pooler, projection and (MoCoSE) predictor: the online heads the optimizer trains beside the encoder."""
        return [m for m in (self.pooler, self.projection, self.predictor) if m is not None]

    def target_modules(self) -> list[nn.Module]:
        """The target encoder and its heads (MoCoSE), or the momentum encoder alone (ESimCSE); [] without a target."""
        return [m for m in (self.target_encoder, self.target_pooler, self.target_projection) if m is not None]

    def set_training(self, training: bool) -> None:
        """Online heads in `training` mode; the target with dropout only when `config.target_dropout` (the reference
        code's) asks for it."""
        for module in self.online_heads():
            module.train(training)
        for module in self.target_modules():
            module.train(training and self.config.target_dropout)

    def ema_parameter_pairs(self, online_encoder: nn.Module, skip=()) -> EMATensorPairs:
        """Online tensors (encoder, pooler, projection) and their target copies, for `EMATargetCallback`; `skip`:
        online tensors the target does not average (e.g. word embeddings it shares); none without a target."""
        return ema_tensor_pairs(zip((online_encoder, self.pooler, self.projection), self.target_modules()), skip=skip)

    # ----------------------------------------------------------------- forward
    def online_key(self, state: Tensor) -> Tensor:
        """`(B, H)` -> `(B, D)`: the online heads without the predictor."""
        return self.projection(self.pooler(state))

    def query(self, encoders: Encoders, inputs, perturbation: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """`(B, D)` queries of `inputs` (FGSM's `perturbation` added) and the word embeddings they read."""
        state, words = encoders.online_query(inputs, perturbation)
        query = self.online_key(state)
        return (query if self.predictor is None else self.predictor(query)), words

    def key(self, encoders: Encoders, inputs, perturbation: Tensor | None = None) -> Tensor:
        """`(B, D)` keys of `inputs`: the EMA target's (no gradient) for MoCoSE, a second online view otherwise."""
        if not self.config.keys_from_target:
            return self.online_key(encoders.online_key(inputs, perturbation)[0])
        with torch.no_grad(), encoders.target_context():
            state = encoders.target_key(inputs, perturbation)[0]
            # fp32, as accelerate returns a forward's outputs under autocast
            return self.target_projection(self.target_pooler(state)).float()

    def forward(self, encoders: Encoders, anchor, positive=None, perturbation: Tensor | None = None,
                perturb_target: bool = True, negatives=None, negatives_as_anchors: bool = False) -> MoCoSEOutput:
        """Queries of `anchor`, keys of `positive` (None: the anchor itself), hard negatives, momentum embeddings.

        Args:
            encoders: the front end's `Encoders`.
            anchor, positive, negatives: the front end's inputs (see `Encode`); `negatives`: UNA's hard negatives,
                encoded like keys (and like queries too with `negatives_as_anchors`, UNA as in its paper).
            perturbation: FGSM's `(B, L, H)` delta on the anchor's online word embeddings, or None.
            perturb_target: whether a key read from the anchor itself sees the delta too.
        """
        query, words = self.query(encoders, anchor, perturbation)
        same_input = positive is None
        key = self.key(encoders, anchor if same_input else positive,
                       perturbation if same_input and perturb_target else None)
        output = MoCoSEOutput(query=query, key=key, word_embeddings=words, fgsm_gradient_at=words)
        if negatives is not None:
            output.negative_keys = self.key(encoders, negatives)
            if negatives_as_anchors:
                output.negative_queries = self.query(encoders, negatives)[0]
        if self.config.queues_target_embeddings:
            with torch.no_grad(), encoders.target_context():
                output.target_embedding = self.online_key(encoders.target_anchor(anchor, None)[0]).float()
        return output
