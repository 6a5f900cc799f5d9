"""`MoCoSELossCallback`: what runs a `MoCoSELoss` from `SentenceTransformerTrainer`'s loop.

A loss cannot register callbacks, so the user passes `callbacks=[loss.callback]`; a loss trained without it
stops at its first step with an error naming this fix. Event by event:

* `on_init_end` (the trainer is built, the optimiser is not): `head_learning_rate` joins
  `args.learning_rate_mapping` as `{"online_head\\.": rate}` unless a pattern of the user's covers the heads.
* `on_train_begin`: refusals (FSDP, DeepSpeed, fp16 under a clip, `launch.preflight`'s, which takes output_dir's
  lock, given back at `on_train_end`), the data checks, a resumed run's loss state (another model's refused, a
  finished run's stops here), rank 0's heads, target and queue on every process.
* `on_pre_optimizer_step`: the heads' gradients clipped jointly with the model's (`st_loss.distributed`).
* `on_optimizer_step`: the EMA update (`EMATargetCallback`).
* `on_step_end` / `on_epoch_end`: the heads' gradients zeroed (the Trainer zeroes the model's). After
  `DefaultFlowCallback` has set `control.should_save`, and at `on_evaluate` (`save_strategy="best"`, deciding as
  the Trainer is about to): the loss state written into the coming checkpoint, so it is there before
  `_save_checkpoint` starts a Hub push; `on_save` checks.
* A stop request (SIGTERM, SIGUSR1, SIGINT: `launch.stop_request`), agreed at `on_step_end` before the loss state is
  written: the step's checkpoint with it, then `on_train_end` raises `StopRequested` (exit status 75).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers.trainer_utils import HubStrategy, SaveStrategy

from ..compat import get_world_size
from ..launch.checkpoints import check_planned_length
from ..launch.preflight import preflight
from ..launch.run_folder import failed_save_sentence, release_run_folder, tensor_bytes
from ..launch.stop_request import StopOnRequestCallback, refuse_jit_checkpoint
from ..models.ema import EMATargetCallback
from .checkpoints import (LOSS_STATE_DIR, STATE_FILE, checkpoint_folder, fingerprint, holds_loss_state, load_loss_state,
                          locate_checkpoint, run_folder, save_loss_state)
from .distributed import HeadGradients, broadcast_from_first_rank, refuse_unsupported_launch
from .inputs import check_training_datasets

HEAD_PARAMETERS = r"online_head\."  # the heads' names in the loss, as `learning_rate_mapping` matches them
CHECKPOINT_PUSHES = (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS)
logger = logging.getLogger(__name__)


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


def _covers_heads(mapping: dict, loss: nn.Module) -> bool:
    names = [f"online_head.{name}" for name, _ in loss.online_head.named_parameters()]
    return any(re.search(pattern, name) for pattern in mapping for name in names)


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
        self._folder: str | None = None  # the output_dir whose lock this run holds (`launch.run_folder`)
        self.stop = StopOnRequestCallback(resume_hint="trainer.train(resume_from_checkpoint=True)")

    # ----------------------------------------------------------------- before the first step
    def on_init_end(self, args, state, control, **kwargs):
        refuse_jit_checkpoint(args)
        if (rate := self.mocose_loss.settings["head_learning_rate"]) is None:
            return
        if (mapping := getattr(args, "learning_rate_mapping", None)) is None:
            raise TypeError(f"MoCoSELoss trains under SentenceTransformerTrainer: head_learning_rate={rate} reaches the "
                            f"optimiser through SentenceTransformerTrainingArguments.learning_rate_mapping, which "
                            f"{type(args).__name__} lacks.")
        if not _covers_heads(mapping, self.mocose_loss):  # a pattern of the user's for the heads wins
            args.learning_rate_mapping = {**mapping, HEAD_PARAMETERS: rate}

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        try:
            self.begin_training(args, state, getattr(train_dataloader, "dataset", None))
        except BaseException:
            self._release_folder()
            raise
        self.stop.on_train_begin(args, state, control)

    def _release_folder(self) -> None:
        if self._folder is not None:
            release_run_folder(self._folder)
            self._folder = None

    def begin_training(self, args, state, dataset=None) -> None:
        """Refusals, data checks, the resumed loss state, one start for every process; before any step."""
        loss = self.mocose_loss
        refuse_unsupported_launch(args)
        loss.adopt_matryoshka_wrapper()  # MatryoshkaLoss(model, loss, dims): its dims, or its refusal, before step 1
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
        self._release_folder()  # held still if an earlier train() raised after its first step
        preflight(args, state.global_step > 0)  # output_dir writable, no other run's checkpoints (resumed: its own)
        self._folder = args.output_dir  # preflight took its lock: given back at on_train_end
        loss.move_to_model_device()
        check_training_datasets(loss, dataset, args)
        if state.global_step > 0:
            self._restore(args, state)
            checkpoint = Path(loss._restored["folder"]).parent  # the checkpoint resumed (or loaded by load_state)
            onward = f"SentenceTransformer({str(checkpoint)!r}), a new MoCoSELoss and a fresh output_dir"
            if 0 < state.max_steps <= state.global_step:  # the Trainer would train one step more and save it
                raise ValueError(f"This run finished at step {state.global_step} (max_steps {state.max_steps}): nothing "
                                 "trained or saved, the model and loss hold it as it ended. To train further, start a "
                                 f"new run from its model: {onward}.")
            check_planned_length(checkpoint, state.max_steps, onward)
        loss._restored = None
        if get_world_size() > 1:
            broadcast_from_first_rank(*loss.state_modules().values())
        self.head_gradients.max_grad_norm = args.max_grad_norm
        loss.online_head.zero_grad()  # none left from an earlier train() or backward
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
        # MoCoSETrainer's step metrics, from the same `ContrastiveObjective.logged_metrics`. Callbacks run after the
        # `report_to` reporters, so these reach the console, `trainer_state.json`'s log history and later
        # callbacks, not TensorBoard/W&B.
        loss = self.mocose_loss
        if logs is None or "loss" not in logs:
            return
        decay = self.last_decay if loss.target_encoder is not None else None  # SimCSE, IFCL: no EMA
        if step := loss.objective.logged_metrics(loss.queue, decay, args.gradient_accumulation_steps):
            logs.update(step)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(step)

    # ----------------------------------------------------------------- checkpoints
    def on_step_end(self, args, state, control, **kwargs):
        self.stop.on_step_end(args, state, control)  # a stop request sets should_save: read just below
        # The Trainer's loop zeroes the model's gradients only: sentence-transformers < 6 left the heads' to add up
        # over the steps (6 zeroes the optimizer's, the same thing).
        self.mocose_loss.online_head.zero_grad()
        self._save_if_due(args, state, control.should_save)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.stop.on_epoch_end(args, state, control)
        self.mocose_loss.online_head.zero_grad()
        self._save_if_due(args, state, control.should_save)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._training and args.save_strategy == SaveStrategy.BEST and state.global_step > 0:
            self._save_if_due(args, state, is_new_best(args, state, metrics or {}))

    def _save_if_due(self, args, state, should_save: bool) -> None:
        checkpoint = checkpoint_folder(args, state)
        if should_save and checkpoint is not None and self._saved_step != state.global_step:
            self._save(checkpoint, args)
            self._saved_step = state.global_step

    def _save(self, checkpoint: Path, args) -> None:
        """`save_loss_state`; a write that fails is one line (`failed_save_sentence`)."""
        loss = self.mocose_loss
        with failed_save_sentence(checkpoint, checkpoint.parent, tensor_bytes(*loss.state_modules().values())):
            save_loss_state(loss, checkpoint, args.process_index, args.should_save)

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
            self._save(checkpoint, args)
        self.stop.on_save(args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False
        self._release_folder()
        self.mocose_loss._ready = False  # a later train() call runs the checks (and any resume) again
        self.stop.on_train_end(args, state, control)
        self.stop.end_run(args)  # a stopped run: StopRequested, so the script stops too (no final save)
