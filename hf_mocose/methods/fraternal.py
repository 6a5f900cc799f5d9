"""IFCL's fraternal word vectors: a second (e.g. other-language) model's tokens in the anchor's width.

The fraternal view fuses, position by position, the anchor's word embeddings with the fraternal
model's (`MoCoSEModel._fraternal_view`), so every fraternal token needs a vector of the anchor
encoder's hidden size H. A model whose word-embedding table is H wide gives it directly. Models with
*factorised* embeddings (ALBERT, ELECTRA-small...) keep a narrow table (width E, e.g. 128) and lift it
to their own hidden size with a pretrained Linear before their first layer; their word vectors are
taken after that lift (W e + b, without their position/token-type embeddings and LayerNorm, which
the anchor's own embedding layer adds after the fusion). No new, untrained map is introduced: when
the (lifted) width still differs from H the model is refused, before training, with both widths.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

# Where encoders with factorised word embeddings keep the Linear(E, hidden) that lifts them: ALBERT, ELECTRA.
EMBEDDING_LIFTS = ("encoder.embedding_hidden_mapping_in", "embeddings_project")


def _embedding_lift(model: PreTrainedModel, width: int) -> tuple[str, nn.Linear] | None:
    for path in EMBEDDING_LIFTS:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(module, nn.Linear) and module.in_features == width:
            return path, module
    return None


@torch.no_grad()
def fraternal_word_vectors(model: PreTrainedModel, hidden: int, name: str = "the fraternal model") -> torch.Tensor:
    """The `(V, hidden)` word vectors of `model` (its vocabulary of V tokens) for the fraternal view.

    Args:
        model: the fraternal model (an `AutoModel`).
        hidden: H, the anchor encoder's hidden size.
        name: how errors name the model (its path or Hub id).

    Raises:
        ValueError: the model's word vectors, lifted when its embeddings are factorised, are not H wide.
    """
    table = model.get_input_embeddings().weight.detach()
    width = table.shape[1]
    lift = _embedding_lift(model, width)
    if lift is None:
        described = f"embedding width {width}"
    else:
        path, linear = lift
        table = linear(table)
        described = (f"factorised word embeddings of width {width}, lifted to width {table.shape[1]} by its own "
                     f"pretrained `{path}`")
    if table.shape[1] != hidden:
        raise ValueError(
            f"fraternal_model_name_or_path {name!r} has {described}, but the encoder's hidden size is {hidden}: "
            f"they must match to be fused position by position. Use a fraternal model of hidden size {hidden} "
            f"(or an encoder of width {table.shape[1]})."
        )
    return table.float().contiguous()
