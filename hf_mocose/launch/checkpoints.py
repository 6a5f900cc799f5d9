"""Which checkpoint a run resumes from, and whether a checkpoint folder is whole and fits the model.

A Trainer checkpoint is written file by file, trainer_state.json last, and safetensors writes the weights to a
`.tmpXXXXXX` file renamed when done; so a process killed while saving leaves a temporary file or misses later files,
and a weights file cut short (full disk, interrupted copy) is shorter than its header says. Such a folder is
*incomplete*: `--resume_from_checkpoint last` skips it (saying why); naming it is refused, with the previous complete
checkpoint as the way out; a resumed run deletes the interrupted folders it will write again.

A checkpoint also has to fit the model: a field that changes a weight's shape (queue_size, the heads, the method,
the encoder) is refused by name with both values before any step; other changed model fields only warn.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path

from safetensors import SafetensorError, safe_open
from transformers import TrainerCallback
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from ..compat import TRAINER_KEEPS_CHECKPOINT_BATCH_SIZE, sort_checkpoints
from ..models.configuration import MODEL_CONFIG_FIELDS

logger = logging.getLogger(__name__)

TEMPORARY_FILE_PREFIX = ".tmp"  # safetensors' temporary weights file (Rust `tempfile`), renamed when complete
JIT_CHECKPOINT_SENTINEL = "checkpoint-is-incomplete.txt"  # transformers' JIT checkpoint, removed when it is done
LAST_CHECKPOINT_VALUES = ("last", "latest", "true")
NO_CHECKPOINT_VALUES = ("", "false", "none", "no")
# What the Trainer rebuilds the scheduler from on a resume: this run's values apply.
SCHEDULE_SETTINGS = ("lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio")
# Config entries that say nothing about the model itself.
_CONFIG_NOISE = {"transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype", "auto_map"}


class IncompleteCheckpointError(ValueError):
    """A checkpoint folder or weights file was cut short (killed during save, full disk, interrupted copy)."""


def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """N for a folder named `checkpoint-N`, else None."""
    prefix, _, step = Path(folder).name.rpartition("-")
    return int(step) if prefix == PREFIX_CHECKPOINT_DIR and step.isdecimal() else None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-N` folders of `output_dir`, oldest step first: the Trainer's own `sort_checkpoints`,
    without the folders it only prefix-matches (`checkpoint-4.bak`), which no Trainer wrote or resumes."""
    return [Path(p) for p in sort_checkpoints(str(output_dir)) if checkpoint_step(p) is not None]


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """Why a `.safetensors` file is unusable (missing, cut short, damaged), or None if it is whole: the verdict
    of `safetensors.safe_open` (the reader transformers loads with), which reads only the header."""
    path = Path(path)
    if not path.is_file():
        return f"{path} is missing"
    try:
        with safe_open(path, framework="pt"):
            return None
    except SafetensorError as err:
        return _describe_damage(path, err)


def _describe_damage(path: Path, err: SafetensorError) -> str:
    """One line for a file `safe_open` refused: where it was cut off and how long it should be (`safe_open`
    gives no sizes, so the expected one is read off the file's own header)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        header_length = int.from_bytes(handle.read(8), "little")
        if size < 8 or 8 + header_length > size:
            return f"{path} is incomplete ({size:,} bytes, cut off inside its header)"
        try:
            header = json.loads(handle.read(header_length))
            end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
            expected = 8 + header_length + int(end)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return f"{path} is not a readable safetensors file (damaged header: {err})"
    if size < expected:
        return f"{path} is incomplete ({size:,} of {expected:,} bytes)"
    if size > expected:
        return f"{path} is not a readable safetensors file ({size:,} bytes, {size - expected:,} more than its header describes)"
    return f"{path} is not a readable safetensors file (damaged header: {err})"


def _weights_files(folder: Path) -> list[Path] | None:
    """The safetensors files holding the weights of `folder` (all shards of an index), [] for .bin, None if none."""
    index = folder / SAFE_WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError):
            return [index]  # reported as damaged by safetensors_problem
        return [folder / shard for shard in shards]
    if (folder / SAFE_WEIGHTS_NAME).is_file():
        return [folder / SAFE_WEIGHTS_NAME]
    return [] if (folder / WEIGHTS_NAME).is_file() or (folder / WEIGHTS_INDEX_NAME).is_file() else None


def weights_problems(folder: str | os.PathLike) -> list[str]:
    """What is wrong with the model weights of `folder` (empty when they are whole)."""
    if (files := _weights_files(Path(folder))) is None:
        return [f"no {SAFE_WEIGHTS_NAME}"]
    return [problem for problem in map(safetensors_problem, files) if problem]


def _is_sharded_engine_checkpoint(folder: Path) -> bool:
    """DeepSpeed / FSDP checkpoints keep weights and optimizer state in their own sub-folders."""
    return (folder / "latest").is_file() or any(p.name.startswith(("global_step", "pytorch_model_fsdp", "optimizer_0"))
                                                 for p in folder.iterdir())


def interrupted_save_problems(folder: str | os.PathLike) -> list[str]:
    """Signs that the save of `folder` never finished: temporary files, transformers' mark of a JIT checkpoint still
    being written, no readable trainer_state.json."""
    folder = Path(folder)
    problems = [f"temporary file {p.name} left by an interrupted save"
                for p in sorted(folder.iterdir()) if p.name.startswith(TEMPORARY_FILE_PREFIX)]
    if (folder / JIT_CHECKPOINT_SENTINEL).exists():
        problems.append(f"{JIT_CHECKPOINT_SENTINEL} (transformers' JIT checkpoint was still being written)")
    state = folder / TRAINER_STATE_NAME
    if not state.is_file():
        problems.append(f"no {TRAINER_STATE_NAME} (the Trainer writes it last)")
    else:
        try:
            json.loads(state.read_text(encoding="utf-8"))
        except ValueError:
            problems.append(f"{TRAINER_STATE_NAME} is cut off")
    return problems


def checkpoint_problems(folder: str | os.PathLike, model_only: bool = False) -> list[str]:
    """Why `folder` cannot be resumed from exactly (empty when it is complete); `model_only` (`save_only_model`):
    no optimizer state required."""
    folder = Path(folder)
    try:
        problems = interrupted_save_problems(folder)
        if not (folder / CONFIG_NAME).is_file():
            problems.append(f"no {CONFIG_NAME}")
        if _is_sharded_engine_checkpoint(folder):
            return problems
        problems += weights_problems(folder)
        if not model_only:
            problems += [f"no {name}" for name in (OPTIMIZER_NAME, SCHEDULER_NAME) if not (folder / name).is_file()]
            if not any(folder.glob("rng_state*.pth")):
                problems.append("no rng_state*.pth")
    except OSError as err:  # e.g. removed while being read
        problems = [f"could not be read ({err})"]
    return problems


def newest_complete_checkpoint(output_dir: str | os.PathLike, before_step: int | None = None,
                               model_only: bool = False) -> Path | None:
    """The complete `checkpoint-N` of `output_dir` with the highest N (below `before_step` if given)."""
    return next((folder for folder in reversed(list_checkpoints(output_dir))
                 if (before_step is None or checkpoint_step(folder) < before_step)
                 and not checkpoint_problems(folder, model_only)), None)


def previous_checkpoint_hint(folder: str | os.PathLike, action: str = "resume from") -> str:
    """'The previous complete checkpoint is ...: <action> it' for a damaged `folder`, or what to do without one."""
    folder = Path(folder)
    if (previous := newest_complete_checkpoint(folder.parent, before_step=checkpoint_step(folder))) is None:
        return f"There is no earlier complete checkpoint in {folder.parent}: {action} another model, or train again."
    if action == "resume from":
        return (f"The previous complete checkpoint is {previous}: resume from it with --resume_from_checkpoint "
                f"{previous} (or 'last', which skips incomplete checkpoints).")
    return f"The previous complete checkpoint is {previous}: {action} it instead."


def check_weights_complete(folder: str | os.PathLike, action: str = "resume from") -> None:
    """Raises `IncompleteCheckpointError` naming the weights file of `folder` when it is cut short or damaged."""
    folder = Path(folder)
    if _weights_files(folder) is None:
        return  # no weights at all: the loader says so in its own words
    if problems := weights_problems(folder):
        raise IncompleteCheckpointError(f"{'; '.join(problems)}: it was cut short while being written or copied, so "
                                        f"{folder} cannot be loaded. " + previous_checkpoint_hint(folder, action))


def resolve_resume_checkpoint(value, output_dir: str | os.PathLike, *, model_only: bool = False) -> str | None:
    """The checkpoint folder to resume from for `resume_from_checkpoint=value`, checked; None for a fresh start.
    `last` (`latest`, `true`, True) picks the newest complete `checkpoint-N`, logging why it skipped newer ones."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in NO_CHECKPOINT_VALUES):
        return None
    if value is True or str(value).strip().lower() in LAST_CHECKPOINT_VALUES:
        for folder in reversed(list_checkpoints(output_dir)):
            if not (problems := checkpoint_problems(folder, model_only)):
                logger.info("resume_from_checkpoint=last: resuming from %s, the newest complete checkpoint.", folder)
                return str(folder)
            logger.warning("resume_from_checkpoint=last: skipped %s, it is incomplete: %s.", folder.name, "; ".join(problems))
        logger.warning("resume_from_checkpoint=last: no complete checkpoint in %s, training from the start.",
                       output_dir)
        return None
    folder = Path(value)
    if not folder.is_dir():
        newest = newest_complete_checkpoint(output_dir, model_only=model_only)
        hint = f" The newest complete checkpoint in {output_dir} is {newest}." if newest else ""
        raise FileNotFoundError(f"resume_from_checkpoint {str(value)!r} is not a folder.{hint}")
    if problems := checkpoint_problems(folder, model_only):
        check_weights_complete(folder)  # a weights file cut short: named first
        raise IncompleteCheckpointError(f"Checkpoint {folder} is incomplete ({'; '.join(problems)}): its save was "
                                        "interrupted. " + previous_checkpoint_hint(folder))
    return str(folder)


def remove_interrupted_checkpoints(output_dir: str | os.PathLike, after_step: int) -> list[Path]:
    """Deletes the `checkpoint-N` folders with N > `after_step` whose save never finished (a resumed run writes
    them again, and would carry their leftover files in); returns them. Finished checkpoints are never touched."""
    removed = []
    for folder in list_checkpoints(output_dir):
        if checkpoint_step(folder) > after_step and (problems := interrupted_save_problems(folder)):
            logger.warning("Removing %s, whose save never finished (%s): this run goes on from step %d and saves "
                           "that step anew.", folder, "; ".join(problems), after_step)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def remove_temporary_files(folder: str | os.PathLike) -> list[Path]:
    """Deletes the `.tmp*` files an interrupted save left in `folder` (before saving into it again)."""
    stale = sorted(Path(folder).glob(f"{TEMPORARY_FILE_PREFIX}*"))  # none in a missing folder
    for path in stale:
        logger.warning("Removing %s, left by an interrupted save.", path)
        path.unlink(missing_ok=True)
    return stale


def resumed_step(checkpoint: str | os.PathLike | None) -> int:
    """The global step a checkpoint was saved at (from its trainer_state.json); 0 for a fresh start."""
    if checkpoint is None:
        return 0
    return int(json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text(encoding="utf-8")).get("global_step", 0))


def check_planned_length(checkpoint: str | os.PathLike, max_steps: int, onward: str) -> None:
    """Refuses to resume `checkpoint` for `max_steps` optimizer steps when its run planned another number (its
    trainer_state.json's `max_steps`) and steps are left to train: the learning-rate schedule and the EMA decay ramp
    are laid out over the planned length, and the optimizer state holds the rate the old one reached (0 at its end),
    so the resumed steps would follow neither plan. `onward`: how this front end starts a new run from its model."""
    if not (path := Path(checkpoint) / TRAINER_STATE_NAME).is_file():
        return  # MoCoSELoss state loaded from a folder without the Trainer's
    state = json.loads(path.read_text(encoding="utf-8"))
    planned, step = state.get("max_steps") or 0, state.get("global_step", 0)
    if planned <= 0 or max_steps <= step or planned == max_steps:
        return
    finish = "it finished there" if step >= planned else f"resume with max_steps {planned} to finish it"
    raise ValueError(f"Cannot resume {checkpoint} (step {step}) with max_steps {max_steps}: its run planned {planned}, "
                     f"and its learning-rate schedule and EMA decay ramp are laid out over {planned} steps (resumed, "
                     f"both would jump onto schedules rebuilt for {max_steps}). {finish[0].upper()}{finish[1:]}; to "
                     f"train further, start a new run from its model: {onward}.")


def prepare_resume(value, args, model) -> str | None:
    """What `MoCoSETrainer.train` does with `resume_from_checkpoint` before `Trainer.train`: resolves and checks
    it, refuses one that does not fit `model` (warning about changed fields), and removes the interrupted
    checkpoint folders this run will write again."""
    if (resume := resolve_resume_checkpoint(value, args.output_dir, model_only=args.save_only_model)) is not None:
        saved = json.loads((Path(resume) / TRAINER_STATE_NAME).read_text(encoding="utf-8")).get("train_batch_size")
        if saved and saved != args.train_batch_size and not args.auto_find_batch_size:
            size, kept = args.per_device_train_batch_size, saved // max(1, args.n_gpu)
            if TRAINER_KEEPS_CHECKPOINT_BATCH_SIZE:  # so that the arguments, the card and the state say what trains
                args.per_device_train_batch_size = kept
                if args.should_log:
                    logger.warning("Resuming %s at per_device_train_batch_size %s, its own, not %s: transformers < 5 "
                                   "resumes at the checkpoint's batch size (an exact resume).", resume, kept, size)
            elif args.should_log:
                logger.warning("Resuming %s, trained at per_device_train_batch_size %s, with per_device_train_batch_"
                               "size %s: not an exact resume (steps per epoch, the data skipped to the checkpoint's "
                               "step and the schedules follow the new size); trainer_state.json and the model card "
                               "record %s from here on.", resume, kept, size, size)
        check_resume_compatible(resume, model)
        check_restored_settings(resume, args)
    if args.should_save:
        remove_interrupted_checkpoints(args.output_dir, after_step=resumed_step(resume))
    return resume


def check_restored_settings(checkpoint: str | os.PathLike, args) -> None:
    """Refuses a resume whose `args` ask for another learning rate, weight decay or Adam setting than the checkpoint's
    optimizer and scheduler restore (`Trainer` loads their state over this run's: the new value would be silently
    ignored), naming each with both values. The schedule's shape (`lr_scheduler_type`, `warmup_*`) is rebuilt from
    this run's arguments: changed ones are listed in one line, from the checkpoint's `card_facts.json`."""
    import torch

    checkpoint = Path(checkpoint)
    if not (checkpoint / OPTIMIZER_NAME).is_file() or not (checkpoint / SCHEDULER_NAME).is_file():
        return  # save_only_model, or an engine's own state
    base_lrs = torch.load(checkpoint / SCHEDULER_NAME, weights_only=True).get("base_lrs") or [None]
    group = torch.load(checkpoint / OPTIMIZER_NAME, weights_only=True, mmap=True)["param_groups"][0]
    restored = {"learning_rate": base_lrs[0], "weight_decay": group.get("weight_decay")}
    if "betas" in group:
        restored.update(adam_beta1=group["betas"][0], adam_beta2=group["betas"][1], adam_epsilon=group.get("eps"))
    if args.head_learning_rate is not None and len(base_lrs) > 2:  # the heads' groups come last (create_optimizer)
        restored["head_learning_rate"] = base_lrs[-1]
    changed = [f"{name} {saved:g} in the checkpoint, {getattr(args, name):g} asked"
               for name, saved in restored.items()
               if saved is not None and not math.isclose(saved, getattr(args, name), rel_tol=1e-6, abs_tol=0.0)]
    if changed:
        raise ValueError(f"Cannot resume {checkpoint} with other optimizer settings ({'; '.join(changed)}): its "
                         "optimizer and scheduler state restore the checkpoint's, so this run's would be silently "
                         "ignored. Resume with the checkpoint's values, or train with the new ones from the start in "
                         "a fresh --output_dir.")
    facts = checkpoint / "card_facts.json"  # publishing.card_facts.CARD_FACTS_JSON (launch may not import it)
    saved = json.loads(facts.read_text(encoding="utf-8")) if facts.is_file() else {}
    saved = saved.get("training_args", {}).get("arguments", {})
    applied = [f"{name} {saved[name]} -> {value}" for name in SCHEDULE_SETTINGS if name in saved
               and saved[name] != (value := getattr(getattr(args, name, None), "value", getattr(args, name, None)))]
    if applied and args.should_log:
        logger.warning("Resuming %s with another learning-rate schedule, applied from here on (checkpoint -> this "
                       "run): %s.", checkpoint, "; ".join(applied))


class RecordTrainBatchSize(TrainerCallback):
    """A resumed state keeps the checkpoint's `train_batch_size`; this run's replaces it (not auto_find's)."""

    def on_train_begin(self, args, state, control, **kwargs):
        if not args.auto_find_batch_size:
            state.train_batch_size = args.train_batch_size


def _flat_config(config: dict, prefix: str = "") -> dict:
    """`config` without `_CONFIG_NOISE`, its nested dicts flattened to dotted keys (`encoder_config.hidden_size`)."""
    flat = {}
    for key, value in config.items():
        if key not in _CONFIG_NOISE:
            flat.update(_flat_config(value, f"{prefix}{key}.") if isinstance(value, dict)
                        else {f"{prefix}{key}": value})
    return flat


def _saved_shapes(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape from the safetensors headers of `folder` (None when the weights are not safetensors)."""
    if not (files := _weights_files(folder)):
        return None
    shapes = {}
    for file in files:
        with safe_open(file, framework="pt") as weights:  # reads the header only
            shapes.update({name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()})
    return shapes


def weights_fingerprint(model):
    """`(P,)` float64 sums of the model's parameters: ties a saved state, or scores, to the weights they came from."""
    import torch
    return torch.stack([p.detach().double().sum() for p in model.parameters()]).cpu()


def _model_fields(config) -> dict:
    """The config entries that describe the model: MoCoSE's own fields and its encoder's (flattened)."""
    flat = _flat_config(config.to_dict())
    return {k: v for k, v in flat.items()
            if k in MODEL_CONFIG_FIELDS or k == "fraternal_vocab_size" or k.startswith("encoder_config.")}


def check_resume_compatible(checkpoint: str | os.PathLike, model) -> dict[str, tuple]:
    """`check_same_model` for a `MoCoSEModel` and its `checkpoint` folder (config and safetensors headers)."""
    checkpoint = Path(checkpoint)
    # Read back through the config class, so that defaults left out of config.json compare equal.
    saved = _model_fields(type(model.config).from_pretrained(checkpoint))
    current = _model_fields(model.config)
    return check_same_model(checkpoint, saved, current, _saved_shapes(checkpoint),
                            {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()})


def check_same_model(checkpoint, saved: dict, current: dict, saved_shapes: dict | None, shapes: dict) -> dict:
    """Refuses a checkpoint of another model, naming what differs: its tensor shapes, its encoder type or method
    (`saved` vs `current` fields; one of the same shapes would load, and its optimizer state land on other
    parameters). Warns about, and returns as `{field: (checkpoint, this run)}`, the other `MODEL_CONFIG_FIELDS`
    that differ. `saved_shapes` None: not compared."""
    differing = {k: (saved.get(k), current.get(k)) for k in sorted(set(saved) | set(current))
                 if saved.get(k) != current.get(k)}
    mismatched = [] if saved_shapes is None else [f"{name} {saved_shapes.get(name)} vs {shapes.get(name)}"
                                                  for name in sorted(set(saved_shapes) | set(shapes))
                                                  if saved_shapes.get(name) != shapes.get(name)]
    kinds = {k: v for k, v in differing.items() if k in ("method", "encoder_config.model_type")}
    if not mismatched and not kinds:
        if changed := {k: v for k, v in differing.items() if k in MODEL_CONFIG_FIELDS}:
            logger.warning("Resuming from %s with changed model settings (checkpoint, this run): %s; training goes "
                           "on with this run's values.", checkpoint, changed)
        return changed
    fields = "; ".join(f"{k}={a!r} in the checkpoint, {k}={b!r} in this run"
                       for k, (a, b) in (kinds or differing).items()) or "no model field differs"
    shapes = ", ".join(mismatched[:3]) + (", ..." if len(mismatched) > 3 else "") or "equal"
    raise ValueError(f"Cannot resume from {checkpoint}: it was saved by another model than this run's ({fields}; "
                     f"tensor shapes, checkpoint vs this run: {shapes}). Resume with the checkpoint's model and "
                     "settings, or start a new run in another output_dir.")
