"""The one contrastive loss every method uses: InfoNCE over cosine similarity / temperature.

The methods differ only in what they pass in: the candidate keys (own key, or the gathered batch) and the extra
negatives (queue, hard negatives) with their weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class ContrastiveLossOutput:
    """Result of `info_nce_loss`: the scalar mean `loss`, and the detached mean cosines of the queries with their
    positive (`positive_cosine`) and with their weighted-in negatives (`negative_cosine`)."""

    loss: torch.Tensor
    positive_cosine: torch.Tensor
    negative_cosine: torch.Tensor


def info_nce_loss(queries: torch.Tensor, keys: torch.Tensor, temperature: float,
                  positive_index: torch.Tensor | None = None, extra_negatives: torch.Tensor | None = None,
                  extra_negative_weights: torch.Tensor | None = None) -> ContrastiveLossOutput:
    r"""InfoNCE: :math:`-\log \frac{e^{q_i\cdot k_i/\tau}}{e^{q_i\cdot k_i/\tau} + \sum_l w_l e^{q_i\cdot n_l/\tau}}`.

    All vectors are L2-normalised here, so dot products are cosines; tau = `temperature` > 0. `queries` `(B, D)`:
    the online outputs q_i. `keys`: `(B, D)` with `positive_index=None` (k_i is q_i's positive and the only key it
    sees), else `(G, D)` candidates (e.g. the global batch's keys), `keys[positive_index[i]]` being q_i's positive
    (`positive_index` `(B,)` long: in-batch negatives on). `extra_negatives` `(N, D)`: shared by all queries (the
    queue, hard negatives), weighted by `extra_negative_weights` `(N,)` w_l >= 0 (0 removes an entry, e.g. an empty
    slot; default ones)."""
    q = F.normalize(queries.float(), dim=-1)
    k = F.normalize(keys.float(), dim=-1)
    if positive_index is None:
        logits = (q * k).sum(-1, keepdim=True)  # (B, 1): the positive only
        target = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        batch_negative_mask = torch.zeros_like(logits, dtype=torch.bool)
    else:
        logits = q @ k.T  # (B, G)
        target = positive_index
        batch_negative_mask = torch.ones_like(logits, dtype=torch.bool)
        batch_negative_mask[torch.arange(q.shape[0], device=q.device), target] = False
    positive_cos = logits.gather(1, target[:, None]).squeeze(1)

    neg_sum = (logits * batch_negative_mask).sum()
    neg_count = batch_negative_mask.sum().to(logits.dtype)
    logits = logits / temperature
    if extra_negatives is not None and extra_negatives.shape[0] > 0:
        n = F.normalize(extra_negatives.float(), dim=-1)
        extra_cos = q @ n.T  # (B, N)
        if extra_negative_weights is None:
            extra_negative_weights = torch.ones(n.shape[0], device=q.device)
        weights = extra_negative_weights.to(extra_cos.dtype)
        # w * exp(x) = exp(x + log w); log 0 = -inf drops the entry without a host sync.
        logits = torch.cat([logits, extra_cos / temperature + torch.log(weights)], dim=1)
        present = (weights > 0).to(extra_cos.dtype)
        neg_sum = neg_sum + (extra_cos * present).sum()
        neg_count = neg_count + present.sum() * q.shape[0]
    loss = F.cross_entropy(logits, target)
    negative_cos = (neg_sum / neg_count.clamp(min=1)).detach()
    return ContrastiveLossOutput(loss, positive_cos.mean().detach(), negative_cos)


def twins_loss(anchor: torch.Tensor, identical: torch.Tensor, fraternal: torch.Tensor, anchor_input: torch.Tensor,
               identical_input: torch.Tensor, fraternal_input: torch.Tensor) -> torch.Tensor:
    r"""IFCL's Twins loss :math:`| e^{s(h,h^+)} - e^{s(h,h^-)} - M |` with
    :math:`M = e^{s(x,x^+)} - e^{s(x,x^-)}` measured on the (pooled) input embeddings.

    The output-space gap between the identical twin (h+, a dropout view) and the fraternal twin (h-, the fused
    translation view) is held to their inputs' gap; `s` is cosine. `anchor`, `identical`, `fraternal`: `(B, D)`
    outputs; `*_input`: `(B, H)` pooled input embeddings. Returns the scalar batch mean."""
    def exp_cos(a, b):
        return torch.exp(F.cosine_similarity(a.float(), b.float(), dim=-1))

    margin = exp_cos(anchor_input, identical_input) - exp_cos(anchor_input, fraternal_input)
    return (exp_cos(anchor, identical) - exp_cos(anchor, fraternal) - margin.detach()).abs().mean()
