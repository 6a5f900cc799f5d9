"""What `MoCoSELoss` accepts as training data, checked when training begins (`check_training_data`).

Text columns only, no labels: sentences, (anchor, positive) pairs, or (anchor, positive, negative_1, ..., negative_n)
with every hard negative filled in; under several processes the same number of keys on every rank at every
step, and a streamed dataset read by shards. The method's own limits (queue and data size, batch) are
`launch.preflight.check_run`'s, which both front ends share.
"""

from __future__ import annotations

from ..compat import SENTENCE_TRANSFORMERS_5, get_world_size
import pyarrow.compute
from torch import nn

from ..data.corpus import LABEL_COLUMNS, TEXT_DTYPES
from ..launch.preflight import check_fills_a_batch, check_run


def dataset_parts(dataset) -> list:
    """The datasets inside a `DatasetDict` or the `ConcatDataset` sentence-transformers makes of one."""
    if dataset is None:
        return []
    if hasattr(dataset, "datasets"):  # torch's ConcatDataset
        return list(dataset.datasets)
    return list(dataset.values()) if isinstance(dataset, dict) else [dataset]


def check_training_datasets(loss: nn.Module, dataset, args=None) -> None:
    """`check_training_data` for each dataset of `dataset`. Several datasets (each with its loss) only in one
    process: accelerate deals the steps' batches out to the processes in turn, so in one step some train another
    loss while MoCoSELoss's gathers wait for them (measured: a hang at the first step)."""
    parts = dataset_parts(dataset)
    if len(parts) > 1 and (world := get_world_size()) > 1:
        raise ValueError(f"MoCoSELoss with {len(parts)} training datasets under {world} processes: accelerate gives "
                         "the processes batches of different datasets in the same step, and MoCoSELoss's gathers would "
                         "wait for the processes training another loss. Train them in one process, or one dataset.")
    for part in parts:
        check_training_data(loss, part, args)


def check_training_data(loss: nn.Module, dataset, args=None) -> None:
    """Raises a `ValueError` naming what does not fit: label or non-text columns, a hard negative missing in some
    rows (every anchor needs the same number), a queue larger than the data, batches that differ between processes."""
    check_streamed_data(dataset, args)
    if not (columns := [c for c in getattr(dataset, "column_names", None) or [] if c != "dataset_name"]):
        return  # not a `datasets` table: nothing to read before the first batch
    if labels := [c for c in columns if c in LABEL_COLUMNS]:
        raise ValueError(f"MoCoSELoss learns from text alone, but the training data has the label column {labels[0]!r}: "
                         f"drop it (dataset.remove_columns({labels!r})).")
    features = getattr(dataset, "features", None) or {}
    for column in columns:
        dtype = getattr(features.get(column), "dtype", None)
        if column in features and dtype not in TEXT_DTYPES:
            raise ValueError(f"MoCoSELoss takes text columns only, but column {column!r} holds {features[column]}.")
    table = getattr(dataset, "data", None)  # a `datasets.Dataset`'s Arrow table: counted without reading rows out
    for column in columns[2:] if hasattr(table, "column") else []:
        values = table.column(column)
        if missing := values.null_count + (pyarrow.compute.sum(pyarrow.compute.equal(values, "")).as_py() or 0):
            raise ValueError(f"MoCoSELoss: the hard-negative column {column!r} is empty in {missing} of {len(dataset)} "
                             f"rows; every anchor needs the same number of hard negatives ({len(columns) - 2}).")
    rows = len(dataset) if hasattr(dataset, "__len__") else None
    world = get_world_size()
    if args is not None:
        check_fills_a_batch(rows, args.per_device_train_batch_size, world, "The training data")
    batch = None if args is None else args.per_device_train_batch_size * world
    check_run(loss.settings, batch, getattr(args, "gradient_accumulation_steps", 1), rows,
              batch_source=f"per_device_train_batch_size={getattr(args, 'per_device_train_batch_size', '?')} x {world} "
                           "processes")
    if rows is not None and args is not None and world > 1 and not args.dataloader_drop_last and rows % batch:
        raise ValueError(f"Under {world} processes every rank must hold the same number of keys at each step, but "
                         f"{rows} rows leave a last batch short of {batch}: set dataloader_drop_last=True.")


def check_streamed_data(dataset, args=None) -> None:
    """A streamed dataset (`datasets.IterableDataset`) under several processes: every rank must read its own
    shards of the stream (accelerate does it with `dispatch_batches=False`: sentence-transformers batches raw
    text, which accelerate's default dispatching of a stream cannot concatenate) and keep full batches. Under
    sentence-transformers < 6 one process needs `dispatch_batches=False` too."""
    from datasets import IterableDataset
    world = get_world_size()
    if not isinstance(dataset, IterableDataset) or args is None:
        return
    if world < 2:
        if SENTENCE_TRANSFORMERS_5 and args.accelerator_config.dispatch_batches is not False:
            raise ValueError("A streamed train_dataset under sentence-transformers < 6: pass accelerator_config="
                             "{'dispatch_batches': False} to SentenceTransformerTrainingArguments (accelerate's default "
                             "dispatching of a stream cannot concatenate the raw text it batches).")
        return
    if args.accelerator_config.dispatch_batches is not False or not args.dataloader_drop_last:
        raise ValueError(f"A streamed train_dataset under {world} processes: pass accelerator_config={{'dispatch_batches': "
                         "False}} (accelerate then gives every rank its own shards of the stream) and "
                         "dataloader_drop_last=True to SentenceTransformerTrainingArguments.")
    if dataset.num_shards % world:
        raise ValueError(f"The streamed train_dataset has {dataset.num_shards} shards, which {world} processes cannot "
                         f"share: give a multiple of {world} (e.g. Dataset.to_iterable_dataset(num_shards={2 * world})).")
