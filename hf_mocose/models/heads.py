"""The heads on top of the encoder's [CLS] state: pooler, projection and predictor Linears.

The MoCoSE paper's heads (Linear + LayerNorm + Dropout blocks; the predictor ends in Linear + Tanh)
start random in the paper and its reference code. `init="identity"` starts every head Linear the
checkpoint does not provide as an identity map instead, so that at step 0 the online query is
tanh(LayerNorm(key)) rather than a random function of the key (see docs/quality.md).
"""

from __future__ import annotations

import torch
from torch import nn

HEAD_INITS = ("random", "identity")


def head_linear(d_in: int, d_out: int, init: str = "random") -> nn.Linear:
    """A head Linear(d_in, d_out); `init="identity"` marks it for `init_head_linear`'s identity init."""
    linear = nn.Linear(d_in, d_out)
    linear.head_init = init
    init_head_linear(linear)
    return linear


@torch.no_grad()
def init_head_linear(linear: nn.Linear, std: float = 0.02) -> None:
    """Initialises a head Linear as it is marked: identity weight (`torch.nn.init.eye_`, also for
    rectangular shapes) and zero bias for `"identity"`; normal(0, std) weight and zero bias otherwise."""
    if linear.weight.is_meta:
        return
    if getattr(linear, "head_init", "random") == "identity":
        nn.init.eye_(linear.weight)
    else:
        linear.weight.normal_(0.0, std)
    if linear.bias is not None:
        linear.bias.zero_()


def init_head_weights(module: nn.Module, std: float) -> None:
    """BERT-style init of one module (use with `Module.apply`): Linears by `init_head_linear` (as marked:
    normal(0, std) or identity), Embedding weights ~ N(0, std), LayerNorm 1 and 0."""
    if isinstance(module, nn.Linear):
        init_head_linear(module, std)  # encoder Linears are unmarked: normal(0, std)
    elif isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.data.normal_(0.0, std)


def _blocks(dims: list[int], dropout: float, init: str) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        layers += [head_linear(d_in, d_out, init), nn.LayerNorm(d_out), nn.Dropout(dropout)]
    return layers


def build_projection(hidden: int, n_layers: int, dropout: float, init: str = "random",
                     out_dim: int | None = None) -> nn.Sequential:
    """`n_layers` blocks of Linear + LayerNorm + Dropout, `(., hidden) -> (., out_dim)`; identity for 0.
    `out_dim` (default `hidden`, the reference code's `out_size`) is the width of keys, queries and queue."""
    out_dim = out_dim or hidden  # n_layers >= 1 for another width: `validate_settings` checks projection_dim
    return nn.Sequential(*_blocks([hidden] * n_layers + [out_dim], dropout, init))


def build_predictor(hidden: int, n_layers: int, width: int | None, dropout: float, init: str = "random") -> nn.Sequential:
    """(n-1) Linear + LayerNorm + Dropout blocks of width `width`, then Linear(., h) + Tanh; identity for 0.
    `hidden` (h): the width of queries and keys. `init="identity"` starts it near a pass-through, tanh(LayerNorm(x))."""
    if n_layers == 0:
        return nn.Sequential()
    dims = [hidden] + [width or hidden] * (n_layers - 1)
    return nn.Sequential(*_blocks(dims, dropout, init), head_linear(dims[-1], hidden, init), nn.Tanh())
