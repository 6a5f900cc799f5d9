"""The training views' word embeddings besides the encoder's own: MoCoSE Table 5's augmentations (token shuffle,
token and feature cutoff; FGSM is part of the step in `models.objective`), ESimCSE's word repetition of the
positive's tokens (`repeat_words`) and IFCL's fraternal word vectors (another model's, fused with the anchor's).

Fraternal width: the fusion adds, position by position, the fraternal model's word vectors to the anchor's
(`MoCoSEModel._fraternal_view`), so each needs the anchor encoder's hidden size H. Models with *factorised*
embeddings (ALBERT, ELECTRA-small...) keep a narrow table (width E) and lift it to their hidden size with a
pretrained Linear before their first layer; their vectors are taken after that lift (W e + b, without their
position/token-type embeddings and LayerNorm, which the anchor's own embedding layer adds after the fusion).
No new, untrained map is introduced: a width that still differs from H is refused before training.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from torch import nn

AUGMENTATION_VIEWS = ("both", "online")


class EmbeddingAugmentation:
    """MoCoSE Table 5's augmentations on the training views' word embeddings, vectorised over the batch; never
    applied at evaluation time (`MoCoSEModel.embed` takes none). `shuffle` permutes the token positions of each
    sentence ([CLS] and padding stay put), as shuffling position ids; `token_cutoff` is the rate of whole token vectors
    zeroed (never [CLS] or padding), `feature_cutoff` that of embedding dimensions zeroed (the same for every token of
    a sentence); `generator`: an optional `torch.Generator`. `views="both"` augments the online view and the key view
    (the target, or SimCSE/IFCL's second dropout view), each with its own draw, as the reference code does;
    `"online"` the online view only."""

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


def repeat_words(rows: list[list[int]], rate: float, rng: np.random.Generator) -> list[list[int]]:
    """ESimCSE's word repetition on tokenised sentences ([CLS] ... [SEP], truncated): for a sentence of L tokens,
    n ~ uniform{0, ..., min(10, int(rate * L)) - 1} tokens other than the first and last are doubled in place
    (none when int(rate * L) is 0), as the authors' code (caskcsg/sentemb ESimCSE/train.py, `dup_type bpe`, the
    setting of its run.sh). The paper writes n in [0, max(2, int(rate * L))]; the released runs drew as here."""
    repeated = []
    for row in rows:
        limit = min(10, int(rate * len(row)), len(row) - 1)
        count = int(rng.integers(limit)) if limit > 0 else 0
        chosen = set(rng.choice(np.arange(1, len(row) - 1), count, replace=False).tolist()) if count else set()
        repeated.append([token for i, token in enumerate(row) for _ in range(1 + (i in chosen))])
    return repeated


def repeat_words_in_batch(features: dict, rate: float, rng: np.random.Generator | None = None, pad_id: int = 0) -> dict:
    """`repeat_words` on a padded batch (`input_ids`, `attention_mask` `(B, L)`), drawn with `rng` (default: seeded
    by the batch's token ids, the same on every rank and after a resume): a new batch, padded to its longest row
    with `pad_id`, token types 0 (as the authors' code sets them)."""
    ids = features["input_ids"].cpu()  # one copy to the host: the draw's seed and the rows
    rng = np.random.default_rng(zlib.crc32(ids.numpy().tobytes())) if rng is None else rng
    rows = repeat_words([r[:n] for r, n in zip(ids.tolist(), features["attention_mask"].sum(1).tolist())], rate, rng)
    width, device = max(map(len, rows)), features["input_ids"].device
    out = {"input_ids": torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], device=device),
           "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)}
    if "token_type_ids" in features:
        out["token_type_ids"] = torch.zeros_like(out["input_ids"])
    return out


# Where encoders with factorised word embeddings keep the Linear(E, hidden) that lifts them: ALBERT, ELECTRA.
EMBEDDING_LIFTS = ("encoder.embedding_hidden_mapping_in", "embeddings_project")


@torch.no_grad()
def fraternal_word_vectors(model: nn.Module, hidden: int, name: str = "the fraternal model") -> torch.Tensor:
    """The `(V, hidden)` word vectors of `model` (the fraternal `AutoModel`, a vocabulary of V tokens) for the
    fraternal view; `hidden` is H, the anchor encoder's hidden size; `name` names the model in errors. A
    `ValueError` if the model's word vectors, lifted when its embeddings are factorised, are not H wide."""
    table = model.get_input_embeddings().weight.detach()
    width = table.shape[1]
    described = f"embedding width {width}"
    modules = dict(model.named_modules())
    for path in EMBEDDING_LIFTS:
        if isinstance(lift := modules.get(path), nn.Linear) and lift.in_features == width:
            table = lift(table)
            described = (f"factorised word embeddings of width {width}, lifted to width {table.shape[1]} by its own "
                         f"pretrained `{path}`")
            break
    if table.shape[1] != hidden:
        raise ValueError(f"fraternal_model_name_or_path {name!r} has {described}, but the encoder's hidden size is "
                         f"{hidden}: they must match to be fused position by position. Use a fraternal model of hidden "
                         f"size {hidden} (or an encoder of width {table.shape[1]}).")
    return table.float().contiguous()
