"""Augmentations on the input word embeddings: FGSM (Goodfellow et al.) as MoCoSE uses it.

x' = x + epsilon * sign(grad_x L), where x are the online word embeddings `(B, L, H)`.

Modes:
  - "previous" (default; the reference code's): reuse the gradient that the *previous* backward
    left on the word embeddings, so the perturbation costs nothing. It needs equal tensor shapes
    from step to step (pad to a fixed `max_seq_length`); when shapes differ it skips, saying so once.
  - "exact": one extra forward/backward on the current batch to get its own gradient.
  - "off": no perturbation.
"""

from __future__ import annotations

import logging

import torch

FGSM_MODES = ("previous", "exact", "off")
FGSM_VIEWS = ("both", "online")

logger = logging.getLogger(__name__)


class FGSMPerturbation:
    """Holds the FGSM settings and, for mode "previous", the sign of the last gradient.

    Args:
        mode: one of `FGSM_MODES`.
        epsilon: the step size (>= 0).
        views: "both" (target branch sees the perturbed embeddings too) or "online".
    """

    def __init__(self, mode: str = "previous", epsilon: float = 5e-9, views: str = "both"):
        if mode not in FGSM_MODES:
            raise ValueError(f"Unknown fgsm_mode {mode!r}; choose one of {', '.join(FGSM_MODES)}.")
        if views not in FGSM_VIEWS:
            raise ValueError(f"Unknown fgsm_views {views!r}; choose one of {', '.join(FGSM_VIEWS)}.")
        if epsilon < 0:
            raise ValueError(f"fgsm_epsilon must be >= 0, got {epsilon!r}.")
        self.mode, self.epsilon, self.views = mode, epsilon, views
        self.last_gradient_sign: torch.Tensor | None = None
        self._warned_shape = False

    @property
    def perturb_target(self) -> bool:
        return self.views == "both"

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        """`(B, L, H)` -> epsilon * sign(gradient)."""
        return self.epsilon * torch.sign(gradient)

    def previous_perturbation(self, word_embeddings_shape: torch.Size) -> torch.Tensor | None:
        """The "previous" perturbation for embeddings of this shape, or None (first step, other shape)."""
        if self.mode != "previous" or self.last_gradient_sign is None:
            return None
        if self.last_gradient_sign.shape != word_embeddings_shape:
            if not self._warned_shape:
                logger.warning(
                    "fgsm_mode='previous' skipped a batch: its word embeddings have shape %s but the previous "
                    "gradient has shape %s (a shorter batch, e.g. the last of an epoch, or unpadded lengths). "
                    "Set dataloader_drop_last and pad_to_max_length to perturb every step; this is said once.",
                    tuple(word_embeddings_shape),
                    tuple(self.last_gradient_sign.shape),
                )
                self._warned_shape = True
            return None
        return self.epsilon * self.last_gradient_sign

    def track(self, word_embeddings: torch.Tensor) -> None:
        """Keeps the sign of the gradient the coming backward leaves on `word_embeddings` (mode "previous")."""
        if self.mode == "previous" and word_embeddings.requires_grad:
            word_embeddings.register_hook(self._store)

    def _store(self, gradient: torch.Tensor) -> None:
        self.last_gradient_sign = torch.sign(gradient.detach())

    def state_dict(self) -> dict:
        return {"last_gradient_sign": self.last_gradient_sign}

    def load_state_dict(self, state: dict) -> None:
        self.last_gradient_sign = state.get("last_gradient_sign")
