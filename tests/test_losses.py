"""InfoNCE against hand-computed values on fixed vectors."""

import math

import torch
from torch.nn import functional as F

from hf_mocose.models.losses import info_nce_loss

TAU = 0.5


def _hand_loss(q, pos, negs):
    """-log exp(q.pos/t) / (exp(q.pos/t) + sum exp(q.n/t)) with normalised vectors, one query."""
    q, pos = F.normalize(q, dim=0), F.normalize(pos, dim=0)
    num = math.exp(float(q @ pos) / TAU)
    den = num + sum(math.exp(float(q @ F.normalize(n, dim=0)) / TAU) for n in negs)
    return -math.log(num / den)


Q = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
K = torch.tensor([[0.8, 0.6], [0.0, 2.0]])
QUEUE = torch.tensor([[-1.0, 0.0], [0.0, -3.0], [1.0, 1.0]])


def test_own_key_only_with_queue():
    out = info_nce_loss(Q, K, TAU, extra_negatives=QUEUE)
    expected = sum(_hand_loss(Q[i], K[i], list(QUEUE)) for i in range(2)) / 2
    assert math.isclose(out.loss.item(), expected, rel_tol=1e-6)


def test_in_batch_negatives_with_queue():
    out = info_nce_loss(Q, K, TAU, positive_index=torch.tensor([0, 1]), extra_negatives=QUEUE)
    expected = (_hand_loss(Q[0], K[0], [K[1], *QUEUE]) + _hand_loss(Q[1], K[1], [K[0], *QUEUE])) / 2
    assert math.isclose(out.loss.item(), expected, rel_tol=1e-6)


def test_positive_index_offset_into_gathered_keys():
    # rank 1 of 2: its queries' positives are rows 2, 3 of the gathered keys
    gathered = torch.cat([QUEUE[:2], K])
    out = info_nce_loss(Q, gathered, TAU, positive_index=torch.tensor([2, 3]))
    expected = (_hand_loss(Q[0], K[0], [QUEUE[0], QUEUE[1], K[1]]) + _hand_loss(Q[1], K[1], [QUEUE[0], QUEUE[1], K[0]])) / 2
    assert math.isclose(out.loss.item(), expected, rel_tol=1e-6)


def test_zero_weight_drops_queue_entry_and_weights_scale_exp():
    out = info_nce_loss(Q, K, TAU, extra_negatives=QUEUE, extra_negative_weights=torch.tensor([1.0, 0.0, 0.5]))
    expected = 0.0
    for i in range(2):
        q, pos = F.normalize(Q[i], dim=0), F.normalize(K[i], dim=0)
        num = math.exp(float(q @ pos) / TAU)
        den = num + math.exp(float(q @ F.normalize(QUEUE[0], dim=0)) / TAU)
        den += 0.5 * math.exp(float(q @ F.normalize(QUEUE[2], dim=0)) / TAU)
        expected += -math.log(num / den) / 2
    assert math.isclose(out.loss.item(), expected, rel_tol=1e-6)


def test_cosine_statistics():
    out = info_nce_loss(Q, K, TAU, positive_index=torch.tensor([0, 1]))
    cos = F.normalize(Q, dim=1) @ F.normalize(K, dim=1).T
    assert math.isclose(out.positive_cosine.item(), cos.diag().mean().item(), rel_tol=1e-6)
    assert math.isclose(out.negative_cosine.item(), (cos[0, 1] + cos[1, 0]).item() / 2, rel_tol=1e-6)


def test_gradient_flows_to_queries_only_through_weighted_terms():
    q = Q.clone().requires_grad_(True)
    out = info_nce_loss(q, K, TAU, extra_negatives=QUEUE, extra_negative_weights=torch.zeros(3))
    out.loss.backward()
    assert torch.isfinite(q.grad).all()
    # all queue entries masked out and no in-batch negatives: only the positive remains, loss 0
    assert out.loss.item() == 0.0
