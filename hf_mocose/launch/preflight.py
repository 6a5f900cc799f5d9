"""What a run's launch or data rules out, checked once for every front end before the first step.

`models.settings.validate_settings` refuses impossible values of the method settings alone; `check_run` refuses
settings that cannot work with this launch's batch (all processes) or this many training rows. `MoCoSETrainer`
calls it when it is built, `MoCoSELoss`'s callback when training begins, `scripts/train.py` before anything is
loaded; all three refuse in the same words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..models.mtd import check_target_reachable
from ..models.ema import ema_decay_range


def check_run(settings: Mapping, keys_per_batch: int | None = None, accumulation_steps: int = 1,
              rows: int | None = None, target_mtd: float | None = None, max_steps: int = -1, batch_source: str = "") -> None:
    """Raises a `ValueError` naming what does not fit.

    Args:
        settings: the method settings (`method`, `queue_size`, `ifcl_forgetting`, `ema_decay_*`; a model config's
            own win over the arguments'), as a mapping.
        keys_per_batch: sentences of one micro-batch over all processes (the keys one step enqueues), or None
            to check the data alone.
        accumulation_steps: micro-batches per optimizer step.
        rows: training rows, when a front end refuses a queue larger than its data (`MoCoSELoss`), else None.
        target_mtd: `MoCoSETrainingArguments.target_mtd`; `max_steps` the run's length for its eta schedule.
        batch_source: how `keys_per_batch` came about, for the message (e.g. "per_device_train_batch_size=1 x 1").
    """
    method, queue_size = settings["method"], settings["queue_size"]
    if rows is not None and method != "simcse" and queue_size > rows:
        raise ValueError(f"queue_size={queue_size} is larger than the training data ({rows} rows): the queue would "
                         "hold several keys of one sentence, an anchor's own earlier key among its negatives. "
                         f"Use queue_size <= {rows}.")
    if keys_per_batch is None:
        return
    if method != "mocose" and keys_per_batch < 2:
        raise ValueError(f"method={method!r} contrasts each sentence with the rest of the batch, but the global batch "
                         f"is {keys_per_batch}{f' ({batch_source})' if batch_source else ''}: use at least 2 sentences "
                         "per step.")
    if method == "ifcl" and settings["ifcl_forgetting"]:
        batches = math.ceil(queue_size / keys_per_batch)
        if settings["ifcl_forgetting"] * batches >= 1:
            raise ValueError(f"ifcl_forgetting (lambda) x queued batches (k = ceil(queue_size / batch) = {batches}) "
                             "must be < 1 so every forgetting coefficient stays positive; got "
                             f"lambda={settings['ifcl_forgetting']}.")
    if target_mtd is not None:
        decays = ema_decay_range(settings["ema_decay_start"], settings["ema_decay_end"], settings["ema_decay_horizon"],
                                 max_steps)
        check_target_reachable(target_mtd, keys_per_batch * accumulation_steps, queue_size, *decays)
