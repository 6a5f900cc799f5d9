r"""Maximum traceable distance (MoCoSE §5): how far back in training the negatives reach.

    d_trace = 1 / (1 - eta) + K / B

with eta the EMA decay (how many steps the target "remembers"), K the number of queue entries in use and B the
global batch per optimizer step (K / B: how many steps the oldest key is old). The paper finds STS best near
d_trace ~ 14.67 (BERT-base) and ~ 22 (BERT-large). Here: d_trace, (eta, K) plans for a target, the queue window
that holds a target while eta follows its schedule (`target_mtd`), and the `hf-mocose mtd` command.
"""

from __future__ import annotations

import argparse
import math

DEFAULT_PLAN_DECAYS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.95, 0.97, 0.99)


def max_traceable_distance(decay: float, queue_size: float, global_batch_size: int) -> float:
    r""":math:`d_{trace} = 1/(1-\eta) + K/B`; infinite for eta = 1."""
    smoothing = math.inf if decay >= 1.0 else 1.0 / (1.0 - decay)
    return smoothing + queue_size / global_batch_size


def queue_size_for_distance(target: float, decay: float, global_batch_size: int) -> float:
    """K = B * (target - 1/(1-eta)): the queue length that gives `target` at decay `decay` (may be < 0)."""
    return -math.inf if decay >= 1.0 else global_batch_size * (target - 1.0 / (1.0 - decay))


def plan(target: float, global_batch_size: int, decays=DEFAULT_PLAN_DECAYS, max_queue_size: int | None = None):
    """(eta, K, d_trace) triples that hit `target` with batch B: K rounded to whole keys, K >= 0 (<= max)."""
    sizes = [(decay, round(queue_size_for_distance(target, decay, global_batch_size))) for decay in decays]
    return [(decay, size, max_traceable_distance(decay, size, global_batch_size)) for decay, size in sizes
            if size >= 0 and (max_queue_size is None or size <= max_queue_size)]


def check_target_reachable(target: float, global_batch_size: int, capacity: int, decay_start: float, decay_end: float):
    """Raises `ValueError` unless d_trace = `target` can be held over the whole eta schedule with K <= capacity."""
    if target <= 1:
        raise ValueError(f"target_mtd must be > 1 (1/(1-eta) >= 1 alone), got {target!r}.")
    low, high = min(decay_start, decay_end), max(decay_start, decay_end)
    if queue_size_for_distance(target, high, global_batch_size) < 0:
        raise ValueError(f"target_mtd={target} cannot be reached: at eta={high} the EMA alone gives 1/(1-eta) = "
                         f"{max_traceable_distance(high, 0, global_batch_size):.2f} > target. Lower ema_decay_end or "
                         "raise target_mtd.")
    needed = queue_size_for_distance(target, low, global_batch_size)
    if needed > capacity:
        raise ValueError(f"target_mtd={target} needs {math.ceil(needed)} queue entries at eta={low} with global batch "
                         f"{global_batch_size}, but queue_size is {capacity}. Raise queue_size, raise ema_decay_start, "
                         "or lower the batch size or target_mtd.")


def active_queue_window(target: float, decay: float, global_batch_size: int, capacity: int) -> int:
    """The number of newest queue entries to use so that d_trace = `target` at decay `decay` (clamped to [0, K])."""
    return int(min(max(round(queue_size_for_distance(target, decay, global_batch_size)), 0), capacity))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "mtd", help="maximum traceable distance: compute it for a config, or plan (eta, K) pairs for a target",
        description="d_trace = 1/(1-eta) + K/B. With --decay and --queue_size: print d_trace. "
        "With --target: list (eta, K) pairs that hit it for the batch size.")
    parser.add_argument("--batch_size", type=int, required=True, help="global batch size B per optimizer step")
    parser.add_argument("--decay", type=float, help="EMA decay eta (e.g. ema_decay_end)")
    parser.add_argument("--queue_size", type=int, help="queue entries in use K")
    parser.add_argument("--target", type=float, help="target d_trace (paper: ~14.67 BERT-base, ~22 BERT-large)")
    parser.add_argument("--decays", type=float, nargs="+", default=list(DEFAULT_PLAN_DECAYS), help="eta values to plan over")
    parser.add_argument("--max_queue_size", type=int, help="largest K to list")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {args.batch_size}.")
    if args.target is None:
        if args.decay is None or args.queue_size is None:
            raise ValueError("give --decay and --queue_size to compute d_trace, or --target to plan.")
        print(f"d_trace = 1/(1-{args.decay}) + {args.queue_size}/{args.batch_size} = "
              f"{max_traceable_distance(args.decay, args.queue_size, args.batch_size):.2f}")
        return 0
    rows = plan(args.target, args.batch_size, args.decays, args.max_queue_size)
    print(f"(eta, K) pairs with d_trace ~ {args.target} at global batch {args.batch_size}:\n")
    print("| eta | K | d_trace |\n| ---: | ---: | ---: |")
    for decay, size, distance in rows:
        print(f"| {decay:g} | {size} | {distance:.2f} |")
    if not rows:
        print("(none: every eta listed gives 1/(1-eta) above the target, or K above --max_queue_size)")
    return 0
