"""`pool_sentence_embedding` runs on sentence-transformers' `Pooling`: bit-identical to the masked mean and
first-token state written by hand (what it computed before), values and gradients, in float32."""

from __future__ import annotations

import pytest
import torch

from hf_mocose.models.pooling import pool_sentence_embedding


def by_hand(hidden, mask, mode):
    if mode == "cls":
        return hidden[:, 0]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


@pytest.mark.parametrize("mode", ["cls", "mean"])
def test_pooling_is_bit_identical_to_the_hand_written_one(mode):
    hidden = torch.randn(6, 11, 32, requires_grad=True)
    mask = torch.ones(6, 11, dtype=torch.long)
    mask[2:, 7:] = 0
    mask[4:, 2:] = 0
    ours = pool_sentence_embedding(hidden, mask, mode)
    want = by_hand(hidden, mask, mode)
    assert ours.shape == (6, 32) and torch.equal(ours, want)
    weights = torch.randn(6, 32)
    assert torch.equal(torch.autograd.grad((ours * weights).sum(), hidden)[0],
                       torch.autograd.grad((want * weights).sum(), hidden)[0])


def test_cls_dense_applies_the_pooler_and_needs_it():
    hidden, mask = torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.long)
    dense = torch.nn.Linear(8, 4)
    assert torch.equal(pool_sentence_embedding(hidden, mask, "cls_dense", dense), dense(hidden[:, 0]))
    with pytest.raises(ValueError, match="needs the pooler's dense layer"):
        pool_sentence_embedding(hidden, mask, "cls_dense")
    with pytest.raises(ValueError, match="Unknown sentence_pooling 'max'"):
        pool_sentence_embedding(hidden, mask, "max")
