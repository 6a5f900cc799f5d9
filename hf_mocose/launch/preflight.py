"""What a run is refused before its first step because of its launch, its folder or its data, for every front end.

`models.settings.validate_settings` refuses impossible values of the method settings alone. Here:

* `check_run`: settings that cannot work with this launch's batch (all processes) or this many training rows;
* `preflight`: the run's folder and data. A training file must exist (a file, folder or glob), hold
  UTF-8 text, a checkpoint named to resume be whole.
  `output_dir` must be writable (else the training is lost at its first save), held by no other live run (the lock
  of `launch.run_folder`, taken here before anything is written there) and hold no other run's `checkpoint-N` (`last`
  would resume the newest, `save_total_limit` delete the others) unless this run continues them or
  `overwrite_output_dir` deletes them first. Data short of one batch is named.

`scripts/train.py` runs both before the model loads; `MoCoSETrainer` (`check_run` when built, `preflight` when `train`
starts) and `MoCoSELoss`'s callback (when training begins) run them too, so all refuse in the same words. Once `preflight` returns, the caller holds `output_dir`'s lock: it gives it back with
`run_folder.release_run_folder` when the run ends.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..data.corpus import check_corpus
from ..models.ema import ema_decay_range
from ..models.mtd import check_target_reachable
from .checkpoints import LAST_CHECKPOINT_VALUES, NO_CHECKPOINT_VALUES, list_checkpoints, resolve_resume_checkpoint
from .run_folder import lock_run_folder, release_run_folder

logger = logging.getLogger(__name__)


def check_fills_a_batch(rows: int | None, batch_size: int, processes: int, what: str = "train_dataset") -> None:
    """Says in one line when the training data has fewer rows than one global batch: every step trains on those."""
    if rows is not None and rows < batch_size * processes:
        logger.warning("%s has %d sentence(s), fewer than one batch of %d (per_device_train_batch_size %d x %d "
                       "process(es)): every step trains on those %d. Give at least %d sentences for the batch asked "
                       "for, or a smaller --per_device_train_batch_size.", what, rows, batch_size * processes,
                       batch_size, processes, rows, batch_size * processes)


def preflight(args, resume_from_checkpoint, rows: int | None = None, text_file: str | None = None) -> None:
    """The module's checks for `args` (`TrainingArguments`), the resume asked for, `rows` sentences (None: not
    counted) and a `text_file` of them (found, not empty, UTF-8: `check_corpus`). A front end without
    `overwrite_output_dir` (`MoCoSELoss`) is pointed to a fresh folder only. Returns holding `output_dir`'s lock (not when it raises)."""
    check_corpus(text_file)
    output_dir, value, overwrite = args.output_dir, resume_from_checkpoint, getattr(args, "overwrite_output_dir", None)
    named = isinstance(value, str) and value.strip().lower() not in (*NO_CHECKPOINT_VALUES, *LAST_CHECKPOINT_VALUES)
    if named:
        resolve_resume_checkpoint(value, output_dir, model_only=args.save_only_model)
    folder = next(p for p in (Path(output_dir).absolute(), *Path(output_dir).absolute().parents) if p.exists())
    try:  # a probe file, deleted as it closes; in the nearest existing parent while output_dir is yet to be made
        tempfile.NamedTemporaryFile(dir=folder, prefix=".hf-mocose-write-probe-").close()
    except OSError as err:
        raise ValueError(f"output_dir {output_dir!r} cannot be written ({err.strerror or type(err).__name__}: "
                         f"{folder}), so the training would be lost at its first save: give a writable "
                         "--output_dir.") from None
    lock_run_folder(output_dir)  # before the first write there: deleting checkpoints, `.tmp*` files, saving
    try:
        _check_earlier_run(args, output_dir, value, named, overwrite)
    except BaseException:
        release_run_folder(output_dir)
        raise
    check_fills_a_batch(rows, args.per_device_train_batch_size, args.world_size)


def _check_earlier_run(args, output_dir, value, named: bool, overwrite) -> None:
    """Refuses, or with `overwrite` deletes, the `checkpoint-N` folders of another run in `output_dir`."""
    found = list_checkpoints(output_dir)
    continues = value is True or str(value).strip().lower() in LAST_CHECKPOINT_VALUES or (
        named and Path(value).resolve().parent == Path(output_dir).resolve())
    names = ", ".join(checkpoint.name for checkpoint in found)
    if found and not continues and not overwrite:
        afresh = "start afresh there with --overwrite_output_dir true (deletes them first), " * (overwrite is False)
        raise ValueError(f"output_dir {output_dir!r} holds another run's checkpoints ({names}): continue that run "
                         f"with --resume_from_checkpoint last, {afresh}or give a fresh --output_dir.")
    if found and not continues and args.should_save:
        logger.warning("overwrite_output_dir: deleting an earlier run's checkpoints in %s (%s).", output_dir, names)
        for checkpoint in found:
            shutil.rmtree(checkpoint)


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
