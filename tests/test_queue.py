"""KeyQueue: initial random fill, growth to K, FIFO order, wrap-around."""

import pytest
import torch

from hf_mocose.models.queue import KeyQueue


def _keys(start, n, dim=4):
    """Distinguishable unit keys: row j is e_0 * cos + e_1 * sin of angle (start + j)."""
    angles = torch.arange(start, start + n, dtype=torch.float32) * 0.1
    out = torch.zeros(n, dim)
    out[:, 0], out[:, 1] = torch.cos(angles), torch.sin(angles)
    return out


def test_initial_fill_is_random_unit_vectors():
    queue = KeyQueue(capacity=10, dim=4, init_size=3)
    assert int(queue.queue_fill) == 3 and int(queue.queue_ptr) == 3
    norms = queue.keys[:3].norm(dim=1)
    assert torch.allclose(norms, torch.ones(3))
    assert torch.count_nonzero(queue.keys[3:]) == 0
    assert queue.valid_mask().tolist() == [True] * 3 + [False] * 7


def test_grows_to_capacity_then_fifo():
    queue = KeyQueue(capacity=5, dim=4, init_size=1)
    queue.enqueue(_keys(0, 2))
    assert int(queue.queue_fill) == 3
    queue.enqueue(_keys(2, 2))
    assert int(queue.queue_fill) == 5 and int(queue.queue_ptr) == 0
    # newest first: keys 3, 2, 1, 0, then the random initial one
    assert torch.allclose(queue.newest_first()[:4], _keys(0, 4).flip(0))
    queue.enqueue(_keys(4, 2))  # overwrites the random key and key 0
    assert int(queue.queue_fill) == 5
    assert torch.allclose(queue.newest_first(), _keys(1, 5).flip(0))


def test_wraps_when_capacity_not_multiple_of_batch():
    queue = KeyQueue(capacity=7, dim=4, init_size=0)
    for step in range(5):  # 15 keys of batch 3 through a ring of 7
        queue.enqueue(_keys(3 * step, 3))
    assert int(queue.queue_ptr) == 15 % 7
    assert torch.allclose(queue.newest_first(), _keys(8, 7).flip(0))
    ages = queue.ages()
    assert sorted(ages.tolist()) == list(range(7))


def test_batch_larger_than_queue_keeps_newest():
    queue = KeyQueue(capacity=4, dim=4, init_size=2)
    queue.enqueue(_keys(0, 6))
    assert torch.allclose(queue.newest_first(), _keys(2, 4).flip(0))


def test_enqueue_normalises_and_keeps_fp32():
    queue = KeyQueue(capacity=4, dim=4)
    queue.enqueue(3 * _keys(0, 2).to(torch.bfloat16))
    assert queue.keys.dtype == torch.float32
    assert torch.allclose(queue.keys[:2].norm(dim=1), torch.ones(2), atol=1e-3)


@pytest.mark.parametrize("capacity,init", [(0, 0), (4, 5), (4, -1)])
def test_bad_sizes(capacity, init):
    """The queue's sizes are method settings, refused where every setting is (`validate_settings`)."""
    from hf_mocose.models.settings import validate_settings

    with pytest.raises(ValueError, match="queue"):
        validate_settings({"queue_size": capacity, "queue_init_size": init})
