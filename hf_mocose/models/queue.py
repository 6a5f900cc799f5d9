"""`KeyQueue`: the FIFO ring of past keys that MoCoSE uses as negatives.

After moco's `builder.py`: one `(K, D)` buffer, a write pointer and a fill count, persistent buffers that
checkpoints carry. Validity and age are tensors (masks), never `.item()`: no host-device sync.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class KeyQueue(nn.Module):
    """A ring buffer of L2-normalised keys, oldest overwritten first. The age of a slot (0 = newest) is
    `(queue_ptr - 1 - slot) mod K`, so "the negatives of ages 256..767" is a mask over the buffer, not a copy.
    `capacity` K keys of width `dim` D; the queue starts with `init_size` K_s random unit vectors (0 <= K_s <= K,
    as `models.settings.validate_settings` checks `queue_size` and `queue_init_size`)."""

    def __init__(self, capacity: int, dim: int, init_size: int = 0):
        super().__init__()
        self.capacity = capacity
        self.init_size = init_size
        # fp32 always, also under mixed precision: keys are compared with a small temperature.
        self.register_buffer("keys", torch.zeros(capacity, dim, dtype=torch.float32))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("queue_fill", torch.zeros((), dtype=torch.long))
        self.reset()

    @torch.no_grad()
    def reset(self, generator: torch.Generator | None = None) -> None:
        """Empties the queue and fills its first K_s slots with random unit vectors."""
        self.keys.zero_()
        if self.init_size and not self.keys.is_meta:
            noise = torch.randn(self.init_size, self.keys.shape[1], generator=generator)
            self.keys[: self.init_size] = F.normalize(noise, dim=1).to(self.keys.device)
        self.queue_ptr.fill_(self.init_size % self.capacity)
        self.queue_fill.fill_(self.init_size)

    @torch.no_grad()
    def enqueue(self, new_keys: torch.Tensor) -> None:
        """Writes `(N, D)` keys (normalised here) in one indexed copy, wrapping around (N > K: the last K)."""
        new_keys = F.normalize(new_keys.detach().float(), dim=1)[-self.capacity :]
        n = new_keys.shape[0]
        slots = (self.queue_ptr + torch.arange(n, device=self.keys.device)) % self.capacity
        self.keys.index_copy_(0, slots, new_keys)
        self.queue_ptr.copy_((self.queue_ptr + n) % self.capacity)
        self.queue_fill.copy_(torch.clamp(self.queue_fill + n, max=self.capacity))

    def ages(self) -> torch.Tensor:
        """`(K,)` long: the age of each slot, 0 = newest; slots not yet written get age >= K."""
        slots = torch.arange(self.capacity, device=self.keys.device)
        age = (self.queue_ptr - 1 - slots) % self.capacity
        return torch.where(age < self.queue_fill, age, age + self.capacity)

    def valid_mask(self) -> torch.Tensor:
        """`(K,)` bool: which slots hold a key."""
        return self.ages() < self.capacity

    def negative_weights(self, age_slices: list[tuple[int, int]] | None = None, newest: int | None = None,
                         forgetting: float | None = None, entries_per_batch: int | None = None) -> torch.Tensor:
        """`(K,)` float weights of the slots as negatives: 0 drops a slot, 1 keeps it. `age_slices` keeps only slots
        whose age lies in one of the half-open ranges `[start, end)` (0 = newest), e.g. `[(0, 256), (768, 1024)]` for
        "all but 256-768"; `newest` only the `newest` youngest slots (MTD-targeted training's active window).
        `forgetting` (IFCL's lambda) weighs the entry of age a (m = a + 1, newest first) `1 - lambda * ceil(m / N)`,
        N = `entries_per_batch`, the keys enqueued per step (IFCL's mini-batch)."""
        ages = self.ages()
        weights = (ages < self.capacity).float()
        if age_slices:
            selected = torch.zeros_like(ages, dtype=torch.bool)
            for start, end in age_slices:
                selected |= (ages >= start) & (ages < end)
            weights = weights * selected
        if newest is not None:
            weights = weights * (ages < newest)
        if forgetting:
            batches_back = torch.div(ages, entries_per_batch, rounding_mode="floor") + 1  # ceil((a + 1) / N)
            weights = weights * (1.0 - forgetting * batches_back).clamp(min=0.0)
        return weights

    def newest_first(self) -> torch.Tensor:
        """`(queue_fill, D)`: the valid keys ordered by age, newest first (syncs; for inspection/tests)."""
        order = torch.argsort(self.ages())
        return self.keys[order[: int(self.queue_fill)]]

    def extra_repr(self) -> str:
        return f"capacity={self.capacity}, dim={self.keys.shape[1]}, init_size={self.init_size}"


def parse_queue_slices(value, queue_size: int) -> list[tuple[int, int]] | None:
    """Parses `"0:256,768:1024"`, `[0, 256]` or `[[0, 256], [768, 1024]]` into checked `(start, end)` age ranges."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            pairs = [tuple(int(x) for x in part.split(":")) for part in value.split(",")]
        except ValueError:
            raise ValueError(f"queue_slice {value!r} is not of the form 'start:end[,start:end...]'.") from None
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(x, int) for x in value):
        pairs = [tuple(value)]
    else:
        pairs = [tuple(pair) for pair in value]
    for pair in pairs:
        if len(pair) != 2 or not 0 <= pair[0] < pair[1] <= queue_size:
            raise ValueError(f"queue_slice {value!r}: each slice must be start:end with 0 <= start < end <= "
                             f"queue_size={queue_size}, got {pair!r}.")
    return [(int(a), int(b)) for a, b in pairs]


def format_queue_slices(slices: list[tuple[int, int]] | None) -> str | None:
    return None if slices is None else ",".join(f"{a}:{b}" for a, b in slices)
