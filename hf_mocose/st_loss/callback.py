"""`MoCoSELossCallback`: what runs a `MoCoSELoss` from `SentenceTransformerTrainer`'s loop.

A loss cannot register callbacks, so the user passes `callbacks=[loss.callback]`; a loss trained without it
stops at its first step with an error naming this fix. Event by event:

* `on_init_end` (the trainer is built, the optimiser is not): `head_learning_rate` joins
  `args.learning_rate_mapping` as `{"online_head\\.": rate}` unless a pattern of the user's covers the heads.
* `on_train_begin`: refusals (FSDP, DeepSpeed, fp16 under a clip), the data checks, a resumed run's loss
  state, rank 0's heads, target and queue on every process.
* `on_pre_optimizer_step`: the heads' gradients clipped jointly with the model's (`st_loss.distributed`).
* `on_optimizer_step`: the EMA update (`EMATargetCallback`).
* `on_step_end` / `on_epoch_end` (after `DefaultFlowCallback` has set `control.should_save`) and
  `on_evaluate` (`save_strategy="best"`, deciding as the Trainer is about to): the loss state written into
  the coming checkpoint, so it is there before `_save_checkpoint` starts a Hub push; `on_save` checks.

`SentenceTransformerTrainer` checkpoints the model only; the loss state goes into `checkpoint-N/mocose_loss/`
of the run's folder (`output_dir`, or a hyperparameter-search trial's): `state.pt` (heads, target, queue, last
EMA decay, a fingerprint of the model weights) and each process's FGSM "previous" sign (`fgsm_rank{r}.pt`).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, HubStrategy, SaveStrategy

from ..compat import get_world_size
from ..models.ema import EMATargetCallback
from ..models.objective import FGSM_STATE_FILE, load_fgsm_state, save_fgsm_state
from ..methods.mtd import max_traceable_distance
from .distributed import HeadGradients, broadcast_from_first_rank, refuse_unsupported_launch

# ----------------------------------------------------------------- the loss state in checkpoints
LOSS_STATE_DIR = "mocose_loss"
STATE_FILE = "state.pt"


def fingerprint(model: nn.Module) -> Tensor:
    """`(P,)` float64 sums of the model's parameters: ties a saved loss state to the model weights of its checkpoint."""
    return torch.stack([p.detach().double().sum() for p in model.parameters()]).cpu()


def run_folder(args, state) -> Path | None:
    """Where this run's `checkpoint-N` folders go, or None under a hyperparameter search without `hp_name`
    (the Trainer names those folders from the search backend's trial id, which callbacks are not given)."""
    if not state.is_hyper_param_search:
        return Path(args.output_dir)
    return Path(args.output_dir) / state.trial_name if state.trial_name else None


def checkpoint_folder(args, state) -> Path | None:
    folder = run_folder(args, state)
    return None if folder is None else folder / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"


def locate_checkpoint(args, state) -> Path | None:
    """The `checkpoint-N` folder of this step the Trainer wrote last, in `output_dir` or a trial folder in it."""
    name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
    root = Path(args.output_dir)
    candidates = [folder for folder in (root / name, *root.glob(f"*/{name}")) if folder.is_dir()]
    return max(candidates, key=lambda folder: folder.stat().st_mtime_ns, default=None)


def holds_loss_state(checkpoint: Path, process_index: int, main_process: bool, fgsm_previous: bool) -> bool:
    """Whether `checkpoint` has what this process writes into it."""
    folder = Path(checkpoint) / LOSS_STATE_DIR
    if main_process and not (folder / STATE_FILE).is_file():
        return False
    return not fgsm_previous or (folder / FGSM_STATE_FILE.format(rank=process_index)).is_file()


def save_loss_state(loss: nn.Module, checkpoint: str | Path, process_index: int, main_process: bool) -> None:
    """Writes `checkpoint/mocose_loss/` (the module docstring): `state.pt` if `main_process`, and this
    process's FGSM "previous" sign."""
    folder = Path(checkpoint) / LOSS_STATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if main_process:
        state = {name: module.state_dict() for name, module in loss.state_modules().items()}
        state.update(ema_last_decay=loss.callback.last_decay, fingerprint=fingerprint(loss.online_model))
        torch.save(state, folder / STATE_FILE)
    save_fgsm_state(loss.fgsm, folder, process_index)


def load_loss_state(loss: nn.Module, checkpoint: str | Path, process_index: int) -> dict[str, Any]:
    """Reads what `save_loss_state` wrote into the loss; returns `{"folder", "fingerprint"}` for the
    check that the model resumed with it is the one it was saved with."""
    folder = Path(checkpoint) / LOSS_STATE_DIR
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"{folder / STATE_FILE} does not exist: {checkpoint} holds no MoCoSELoss state.")
    device = next(loss.online_head.parameters()).device
    state = torch.load(folder / STATE_FILE, map_location=device, weights_only=True)
    for name, module in loss.state_modules().items():
        module.load_state_dict(state[name])
    loss.callback.last_decay = state["ema_last_decay"]
    load_fgsm_state(loss.fgsm, folder, process_index, device)
    return {"folder": folder, "fingerprint": state["fingerprint"]}


def is_new_best(args, state, metrics: dict[str, float]) -> bool:
    """What `Trainer._determine_best_metric` is about to decide from `metrics` (`on_evaluate` runs before
    it updates `state.best_metric`): whether `save_strategy="best"` saves this step."""
    if (name := args.metric_for_best_model) is None:
        return False
    key = name if name.startswith("eval_") else f"eval_{name}"
    if key not in metrics:
        return False
    if state.best_metric is None:
        return True
    return metrics[key] > state.best_metric if args.greater_is_better else metrics[key] < state.best_metric


HEAD_PARAMETERS = r"online_head\."  # the heads' names in the loss, as `learning_rate_mapping` matches them
LABEL_COLUMNS = ("label", "labels", "score", "scores")  # what sentence-transformers' collator reads as labels
CHECKPOINT_PUSHES = (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS)
logger = logging.getLogger(__name__)


def _covers_heads(mapping: dict, loss: nn.Module) -> bool:
    names = [f"online_head.{name}" for name, _ in loss.online_head.named_parameters()]
    return any(re.search(pattern, name) for pattern in mapping for name in names)


def _parts(dataset) -> list:
    """The datasets inside a `DatasetDict` or the `ConcatDataset` sentence-transformers makes of one."""
    if dataset is None:
        return []
    if hasattr(dataset, "datasets"):  # torch's ConcatDataset
        return list(dataset.datasets)
    return list(dataset.values()) if isinstance(dataset, dict) else [dataset]


def check_training_data(loss: nn.Module, dataset, args=None) -> None:
    """Raises a `ValueError` naming what does not fit: label or non-text columns, not one or two text
    columns, a queue larger than the data, batches that differ between processes."""
    check_streamed_data(dataset, args)
    if not (columns := [c for c in getattr(dataset, "column_names", None) or [] if c != "dataset_name"]):
        return  # not a `datasets` table: nothing to read before the first batch
    if labels := [c for c in columns if c in LABEL_COLUMNS]:
        raise ValueError(f"MoCoSELoss learns from text alone, but the training data has the label column {labels[0]!r}: "
                         f"drop it (dataset.remove_columns({labels!r})).")
    features = getattr(dataset, "features", None) or {}
    for column in columns:
        dtype = getattr(features.get(column), "dtype", None)
        if column in features and dtype not in ("string", "large_string"):
            raise ValueError(f"MoCoSELoss takes text columns only, but column {column!r} holds {features[column]}.")
    if len(columns) > 2:
        raise ValueError(f"MoCoSELoss takes one text column (sentences) or two ((anchor, positive) pairs), but the "
                         f"training data has {len(columns)}: {columns}. Keep them with dataset.select_columns([...]).")
    rows = len(dataset) if hasattr(dataset, "__len__") else None
    if rows is not None and loss.queue is not None and loss.queue.capacity > rows:
        raise ValueError(f"queue_size={loss.queue.capacity} is larger than the training data ({rows} rows): the queue would "
                         f"hold several keys of one sentence, an anchor's own earlier key among its negatives. "
                         f"Use queue_size <= {rows}.")
    world = get_world_size()
    if rows is not None and args is not None and world > 1 and not args.dataloader_drop_last:
        per_step = args.per_device_train_batch_size * world
        if rows % per_step:
            raise ValueError(f"Under {world} processes every rank must hold the same number of keys at each step, but "
                             f"{rows} rows leave a last batch short of {per_step}: set dataloader_drop_last=True.")


def check_streamed_data(dataset, args=None) -> None:
    """A streamed dataset (`datasets.IterableDataset`) under several processes: every rank must read its own
    shards of the stream (accelerate does it with `dispatch_batches=False`: sentence-transformers batches raw
    text, which accelerate's default dispatching of a stream cannot concatenate) and keep full batches."""
    from datasets import IterableDataset
    world = get_world_size()
    if not isinstance(dataset, IterableDataset) or world < 2 or args is None:
        return
    if args.accelerator_config.dispatch_batches is not False or not args.dataloader_drop_last:
        raise ValueError(f"A streamed train_dataset under {world} processes: pass accelerator_config={{'dispatch_batches': "
                         "False}} (accelerate then gives every rank its own shards of the stream) and "
                         "dataloader_drop_last=True to SentenceTransformerTrainingArguments.")
    if dataset.num_shards % world:
        raise ValueError(f"The streamed train_dataset has {dataset.num_shards} shards, which {world} processes cannot "
                         f"share: give a multiple of {world} (e.g. Dataset.to_iterable_dataset(num_shards={2 * world})).")


class MoCoSELossCallback(EMATargetCallback):
    """Runs `mocose_loss` from the Trainer loop (the module docstring lists what, event by event); `head_gradients`
    averages and clips the heads' gradients (`HeadGradients`)."""

    def __init__(self, mocose_loss: nn.Module):
        settings = mocose_loss.settings
        super().__init__(mocose_loss, settings["ema_decay_start"], settings["ema_decay_end"], settings["ema_decay_horizon"])
        self.mocose_loss = mocose_loss
        self.head_gradients = HeadGradients()
        self._training = False
        self._saved_step: int | None = None

    # ----------------------------------------------------------------- before the first step
    def on_init_end(self, args, state, control, **kwargs):
        if (rate := self.mocose_loss.settings["head_learning_rate"]) is None:
            return
        if (mapping := getattr(args, "learning_rate_mapping", None)) is None:
            raise TypeError(f"MoCoSELoss trains under SentenceTransformerTrainer: head_learning_rate={rate} reaches the "
                            f"optimiser through SentenceTransformerTrainingArguments.learning_rate_mapping, which "
                            f"{type(args).__name__} lacks.")
        if not _covers_heads(mapping, self.mocose_loss):  # a pattern of the user's for the heads wins
            args.learning_rate_mapping = {**mapping, HEAD_PARAMETERS: rate}

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.begin_training(args, state, getattr(train_dataloader, "dataset", None))

    def begin_training(self, args, state, dataset=None) -> None:
        """Refusals, data checks, the resumed loss state, one start for every process; before any step."""
        loss = self.mocose_loss
        refuse_unsupported_launch(args)
        rate = loss.settings["head_learning_rate"]
        if rate is not None and not _covers_heads(getattr(args, "learning_rate_mapping", None) or {}, loss):
            raise ValueError(f"MoCoSELoss(head_learning_rate={rate}) gives the heads their learning rate when the trainer "
                             "is built, but its callback was added later: pass callbacks=[loss.callback] to "
                             "SentenceTransformerTrainer(...), or set head_learning_rate=None.")
        if (state.is_hyper_param_search and run_folder(args, state) is None and args.push_to_hub
                and args.hub_strategy in CHECKPOINT_PUSHES):
            strategy = getattr(args.hub_strategy, "value", args.hub_strategy)
            raise ValueError("Under hyperparameter_search MoCoSELoss finds the trial's folder from its name before a "
                             f"checkpoint is pushed (hub_strategy={strategy!r}): pass hp_name, e.g. "
                             "trainer.hyperparameter_search(..., hp_name=lambda trial: f'run-{trial.number}').")
        loss.move_to_model_device()
        for part in _parts(dataset):
            check_training_data(loss, part, args)
        if state.global_step > 0:
            self._restore(args, state)
        loss._restored = None
        if get_world_size() > 1:
            broadcast_from_first_rank(*loss.state_modules().values())
        self.head_gradients.max_grad_norm = args.max_grad_norm
        self._training, self._saved_step = True, None
        loss._ready = True

    def _restore(self, args, state) -> None:
        loss = self.mocose_loss
        if loss._restored is None:
            checkpoint = checkpoint_folder(args, state)
            if checkpoint is None or not (checkpoint / LOSS_STATE_DIR / STATE_FILE).is_file():
                where = checkpoint / LOSS_STATE_DIR if checkpoint is not None else "the trial's checkpoint"
                raise FileNotFoundError(
                    f"Resuming at step {state.global_step}, but {where} holds no MoCoSELoss state (target, heads, "
                    "queue). For a checkpoint outside output_dir, call loss.load_state(CHECKPOINT) before "
                    "trainer.train(resume_from_checkpoint=CHECKPOINT).")
            loss._restored = load_loss_state(loss, checkpoint, args.process_index)
        saved, current = loss._restored["fingerprint"], fingerprint(loss.online_model)
        if saved.shape != current.shape or not torch.allclose(saved, current, rtol=1e-7, atol=0.0):
            raise ValueError(f"The MoCoSELoss state in {loss._restored['folder']} was saved with other model weights "
                             f"than the checkpoint resumed at step {state.global_step}: load that checkpoint's own.")

    # ----------------------------------------------------------------- every optimizer step
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.head_gradients.clip(self.mocose_loss.online_model, self.mocose_loss.online_head)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # MoCoSETrainer's step metrics under the same names. Callbacks run after the `report_to` reporters, so
        # these reach the console, `trainer_state.json`'s log history and later callbacks, not TensorBoard/W&B.
        loss = self.mocose_loss
        metrics = loss.objective.pop_metrics() if logs is not None and "loss" in logs else {}
        if not metrics:
            return
        values = torch.stack([value.float() for value in metrics.values()])
        if get_world_size() > 1:
            dist.all_reduce(values)
            values /= get_world_size()
        step = {name: round(value, 4) for name, value in zip(metrics, values.tolist())}
        if loss.queue is not None:
            step["queue_fill"] = int(loss.queue.queue_fill)
        if self.last_decay is not None and loss.target_encoder is not None:  # SimCSE, IFCL: no EMA
            batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * get_world_size()
            step["ema_decay"] = round(self.last_decay, 6)
            step["d_trace"] = round(max_traceable_distance(self.last_decay, loss.queue.capacity, batch), 4)
        logs.update(step)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(step)

    # ----------------------------------------------------------------- checkpoints
    def on_step_end(self, args, state, control, **kwargs):
        self._save_if_due(args, state, control.should_save)

    on_epoch_end = on_step_end

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._training and args.save_strategy == SaveStrategy.BEST and state.global_step > 0:
            self._save_if_due(args, state, is_new_best(args, state, metrics or {}))

    def _save_if_due(self, args, state, should_save: bool) -> None:
        checkpoint = checkpoint_folder(args, state)
        if should_save and checkpoint is not None and self._saved_step != state.global_step:
            save_loss_state(self.mocose_loss, checkpoint, args.process_index, args.should_save)
            self._saved_step = state.global_step

    def on_push_begin(self, args, state, control, **kwargs):
        # sentence-transformers copies the checkpoint's folders into output_dir for the model's push to the repo
        # root; the loss state (a second copy of the model, the heads, the queue) belongs to the checkpoint only.
        copied = Path(args.output_dir) / LOSS_STATE_DIR
        if copied.is_dir():
            shutil.rmtree(copied)

    def on_save(self, args, state, control, **kwargs):
        if (checkpoint := checkpoint_folder(args, state) or locate_checkpoint(args, state)) is None:
            logger.warning("MoCoSELoss found no checkpoint-%d folder under %s: its state was not saved.",
                           state.global_step, args.output_dir)
            return
        previous = self.mocose_loss.fgsm.mode == "previous"
        if not holds_loss_state(checkpoint, args.process_index, args.should_save, previous):
            if args.push_to_hub and args.hub_strategy in CHECKPOINT_PUSHES and run_folder(args, state) is not None:
                logger.warning("MoCoSELoss wrote its state into %s after the Trainer started pushing it (a callback "
                               "after loss.callback asked for this save); the pushed copy lacks it.", checkpoint)
            save_loss_state(self.mocose_loss, checkpoint, args.process_index, args.should_save)

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False
        self.mocose_loss._ready = False  # a later train() call runs the checks (and any resume) again
