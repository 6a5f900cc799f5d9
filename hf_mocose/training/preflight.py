"""What is refused about a run's folder and data before its first step (`scripts/train.py`: before the model loads).

A training file must be UTF-8, a checkpoint named to resume whole. `output_dir` must be writable (else the training is lost at its first
save) and hold no other run's `checkpoint-N` (`last` would resume the newest, `save_total_limit` delete the others)
unless this run continues them or `overwrite_output_dir` deletes them first. Data short of one batch is named.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from ..data.corpus import check_utf8
from .checkpoints import LAST_CHECKPOINT_VALUES, NO_CHECKPOINT_VALUES, list_checkpoints, resolve_resume_checkpoint

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
    counted) and a `text_file` of them (UTF-8: `check_utf8`). A front end without `overwrite_output_dir`
    (`MoCoSELoss`) is pointed to a fresh folder only."""
    check_utf8(text_file)
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
    check_fills_a_batch(rows, args.per_device_train_batch_size, args.world_size)
