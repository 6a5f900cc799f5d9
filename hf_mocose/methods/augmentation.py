"""Augmentations on the input word embeddings: FGSM (Goodfellow et al.) as MoCoSE uses it.

x' = x + epsilon * sign(grad_x L), where x are the online word embeddings `(B, L, H)`.

Units of epsilon:
  - "absolute" (the paper's): the step is epsilon itself. The paper's 5e-9 is about one float32 ulp of
    a word-embedding entry (their RMS is ~0.05 in BERT-style models) and rounds away in bf16, so at
    that value the perturbation does nothing measurable.
  - "embedding_rms": the step is epsilon times the root-mean-square of the batch's word-embedding
    entries, so epsilon is a relative size (0.01 moves each entry by 1 % of a typical entry) that
    means the same for every encoder and precision.

Modes:
  - "previous" (default; the reference code's): reuse the sign of the gradient that the *previous*
    backward left on the word embeddings, so the perturbation costs nothing. A sign of another shape
    (dynamic padding, a short last batch) is cropped or zero-filled to the current batch's shape.
  - "exact": one extra forward/backward on the current batch to get its own gradient.
  - "off": no perturbation.
"""

from __future__ import annotations

import logging

import torch

FGSM_MODES = ("previous", "exact", "off")
FGSM_VIEWS = ("both", "online")
FGSM_EPSILON_UNITS = ("absolute", "embedding_rms")
AUGMENTATION_VIEWS = ("both", "online")

logger = logging.getLogger(__name__)


class FGSMPerturbation:
    """Holds the FGSM settings and, for mode "previous", the sign of the last gradient.

    Args:
        mode: one of `FGSM_MODES`.
        epsilon: the step size (>= 0), in `epsilon_unit`s.
        views: "both" (target branch sees the perturbed embeddings too) or "online".
        epsilon_unit: "absolute" or "embedding_rms" (see the module docstring).
    """

    def __init__(self, mode: str = "previous", epsilon: float = 5e-9, views: str = "both",
                 epsilon_unit: str = "absolute"):
        # The values come checked from the method settings (`hf_mocose.models.settings.validate_settings`).
        self.mode, self.epsilon, self.views, self.epsilon_unit = mode, epsilon, views, epsilon_unit
        self.last_gradient_sign: torch.Tensor | None = None
        self.last_step_size: torch.Tensor | float = epsilon

    @property
    def perturb_target(self) -> bool:
        return self.views == "both"

    def step_size(self, word_embeddings: torch.Tensor) -> torch.Tensor | float:
        """The step for embeddings like `word_embeddings` `(B, L, H)`: epsilon, or epsilon x their RMS
        (a 0-dim tensor, no host sync) for `epsilon_unit="embedding_rms"`."""
        if self.epsilon_unit == "absolute":
            return self.epsilon
        return self.epsilon * word_embeddings.detach().float().pow(2).mean().sqrt()

    def step(self, gradient: torch.Tensor, word_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """`(B, L, H)` -> step * sign(gradient); `word_embeddings` `(B, L, H)` set the step for "embedding_rms"."""
        if self.epsilon_unit != "absolute" and word_embeddings is None:
            raise ValueError("fgsm_epsilon_unit='embedding_rms' needs the word embeddings to scale the step.")
        size = self.epsilon if word_embeddings is None else self.step_size(word_embeddings)
        return size * torch.sign(gradient)

    def previous_perturbation(self, word_embeddings_shape: torch.Size) -> torch.Tensor | None:
        """The "previous" perturbation `(B, L, H)` for embeddings of this shape, or None (first step).

        A previous gradient sign of another shape (a shorter last batch, or batches padded to their
        longest sentence, as sentence-transformers pads) is fitted to `(B, L, H)`: cropped where it is
        larger, zero where it has no value. It belongs to other sentences anyway (the reference code
        reuses the previous batch's sign), so only the shape must fit; with fixed padding nothing changes.
        """
        if self.mode != "previous" or self.last_gradient_sign is None:
            return None
        sign = self.last_gradient_sign
        if sign.shape != word_embeddings_shape:
            fitted = sign.new_zeros(word_embeddings_shape)
            rows, length = min(sign.shape[0], fitted.shape[0]), min(sign.shape[1], fitted.shape[1])
            fitted[:rows, :length] = sign[:rows, :length]
            sign = fitted
        return self.last_step_size * sign

    def track(self, word_embeddings: torch.Tensor, gradient_at: torch.Tensor | None = None) -> None:
        """Keeps the sign of the gradient the coming backward leaves on `word_embeddings` `(B, L, H)` (mode
        "previous"), and the step size those embeddings call for.

        `gradient_at` `(B, L, H)`: where to read that gradient instead, a tensor whose gradient equals theirs:
        the clean word embeddings the model took as input, before it added the perturbation. Under
        `torch_compile` only a compiled module's inputs get gradients, not the tensors it returns.
        """
        source = word_embeddings if gradient_at is None else gradient_at
        if self.mode == "previous" and source.requires_grad:
            source.register_hook(self._store)
            self.last_step_size = self.step_size(word_embeddings)

    def _store(self, gradient: torch.Tensor) -> None:
        self.last_gradient_sign = torch.sign(gradient.detach())

    def state_dict(self) -> dict:
        return {"last_gradient_sign": self.last_gradient_sign, "last_step_size": self.last_step_size}

    def load_state_dict(self, state: dict) -> None:
        self.last_gradient_sign = state.get("last_gradient_sign")
        self.last_step_size = state.get("last_step_size", self.epsilon)


class EmbeddingAugmentation:
    """MoCoSE Table 5's augmentations on the training views' word embeddings, vectorised over the batch.

    Never applied at evaluation time: `MoCoSEModel.embed` takes no augmentation.

    Args:
        shuffle: permute the token positions of each sentence ([CLS] and padding stay put),
            i.e. the same as shuffling position ids.
        token_cutoff: rate of whole token vectors zeroed (never [CLS] or padding).
        feature_cutoff: rate of embedding dimensions zeroed, the same dimensions for every token of a sentence.
        generator: optional `torch.Generator` for reproducible draws.
        views: one of `AUGMENTATION_VIEWS`: `"both"` augments the online view and the key view (the
            target, or SimCSE/IFCL's second dropout view), each with its own draw, as the reference code
            does; `"online"` the online view only.
    """

    def __init__(self, shuffle: bool = False, token_cutoff: float = 0.0, feature_cutoff: float = 0.0, generator=None,
                 views: str = "both"):
        for name, rate in (("token_cutoff", token_cutoff), ("feature_cutoff", feature_cutoff)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {rate!r}.")
        if views not in AUGMENTATION_VIEWS:
            raise ValueError(f"Unknown augmentation_views {views!r}; choose one of {', '.join(AUGMENTATION_VIEWS)}.")
        self.shuffle, self.token_cutoff, self.feature_cutoff = shuffle, token_cutoff, feature_cutoff
        self.generator, self.views = generator, views

    @property
    def active(self) -> bool:
        return self.shuffle or self.token_cutoff > 0 or self.feature_cutoff > 0

    def forward_kwargs(self) -> dict:
        """`MoCoSEModel.forward` arguments that apply these augmentations to the chosen views."""
        if not self.active:
            return {}
        return {"online_augmentation": self, "key_augmentation": self if self.views == "both" else None}

    def _rand(self, *shape, device) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator).to(device) if self.generator else torch.rand(*shape, device=device)

    def __call__(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`(B, L, H)` embeddings and `(B, L)` mask -> augmented `(B, L, H)` embeddings."""
        batch, length, hidden = embeddings.shape
        device = embeddings.device
        movable = attention_mask.bool().clone()
        movable[:, 0] = False  # [CLS] stays first: the sentence embedding is read there
        if self.shuffle:
            # Sort random keys; fixed tokens get keys that keep them in place (CLS -1, padding 2 + position).
            positions = torch.arange(length, device=device).expand(batch, length)
            keys = torch.where(movable, self._rand(batch, length, device=device), 2.0 + positions)
            keys[:, 0] = -1.0
            order = keys.argsort(dim=1)
            embeddings = embeddings.gather(1, order[..., None].expand(-1, -1, hidden))
        if self.token_cutoff > 0:
            drop = (self._rand(batch, length, device=device) < self.token_cutoff) & movable
            embeddings = embeddings.masked_fill(drop[..., None], 0.0)
        if self.feature_cutoff > 0:
            drop = self._rand(batch, 1, hidden, device=device) < self.feature_cutoff
            embeddings = embeddings.masked_fill(drop, 0.0)
        return embeddings
