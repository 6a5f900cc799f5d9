"""The hyper-parameters a model card shows: which, under what label, and what an unset (None) value meant.

The training arguments come from the run's card facts (`card_facts.json`; the pickled `training_args.bin` is never
read), the model's from the checkpoint's `config.json`. An argument left at None is shown as what None stood for
(e.g. the heads' learning rate = the encoder's), never as "None"; optional switches left off are not listed.
"""

from __future__ import annotations

from typing import Any

from ..models.settings import METHOD_SETTINGS


def _setting_rows(*groups: str) -> dict[str, str]:
    """The card labels of the training-only method settings of `groups`, in their declared order."""
    return {s.name: s.label for s in METHOD_SETTINGS if s.label and not s.model and s.group in groups}


# Training-argument fields shown in the card, with their labels (the method settings' from `models.settings`).
TRAINING_FIELDS = {
    **_setting_rows("target", "fgsm"),
    "per_device_train_batch_size": "batch size per device",
    "gradient_accumulation_steps": "gradient accumulation steps", "world_size": "processes",
    "learning_rate": "learning rate (encoder)",
    **_setting_rows("optimizer"),
    "optim": "optimizer", "adam_beta1": "Adam β1", "adam_beta2": "Adam β2", "adam_epsilon": "Adam ε",
    "weight_decay": "weight decay", "max_grad_norm": "gradient clipping (max norm)",
    "bf16": "mixed precision",  # one row for bf16/fp16, see `training_rows`
    "num_train_epochs": "epochs", "max_steps": "max optimizer steps", "lr_scheduler_type": "LR schedule",
    "warmup_steps": "warm-up steps", "seed": "seed", "load_best_model_at_end": "checkpoint exported",
    # method-family switches, shown when the run set them
    "queue_slice": "negatives: queue ages (0 = newest)", "target_mtd": "target maximum traceable distance",
    "token_shuffle": "token shuffle", "token_cutoff": "token cutoff rate", "feature_cutoff": "feature cutoff rate",
    "augmentation_views": "views the embedding augmentations reach", "hard_negatives": "hard negatives",
    "una_frequency": "UNA negatives every f steps", "una_usage": "UNA sentences used as",
    **_setting_rows("method"),  # word repetition (ESimCSE's augmentation, a switch for every method)
}
# Recorded beside TRAINING_FIELDS because a row is read from them.
RECORDED_EXTRA = ("fp16", "metric_for_best_model")
# Shown only when they differ from "off" (None / False / 0); the rest of TRAINING_FIELDS always.
OPTIONAL_TRAINING_FIELDS = ("ema_decay_horizon", "queue_slice", "target_mtd", "token_shuffle", "token_cutoff",
                            "feature_cutoff", "hard_negatives", "word_repetition_rate")
# Where and how a run logged, not how it trained (sentence-transformers' card leaves them out too), and secrets.
NOT_HYPERPARAMETERS = {
    "output_dir", "overwrite_output_dir", "logging_dir", "logging_strategy", "logging_first_step", "logging_steps", "eval_strategy",
    "eval_steps", "eval_delay", "save_strategy", "save_steps", "save_total_limit", "report_to", "do_train", "do_eval",
    "do_predict", "run_name", "hub_model_id", "hub_token", "push_to_hub", "resume_from_checkpoint", "disable_tqdm",
    "trackio_space_id", "project"}
# The model's rows, read from config.json: the method settings that are `MoCoSEConfig` fields and have a label.
MODEL_FIELDS = {s.name: s.label for s in METHOD_SETTINGS if s.label and s.model}


def as_record(training_args: Any | None) -> dict[str, Any]:
    """The card's fields of a live arguments object or of a JSON record (`world_size` too), enums as values."""
    if training_args is None:
        return {}
    names = (*TRAINING_FIELDS, *RECORDED_EXTRA, "arguments")
    if isinstance(training_args, dict):
        record = {name: training_args[name] for name in names if name in training_args}
    else:
        record = {name: getattr(training_args, name) for name in names if hasattr(training_args, name)}
        if hasattr(training_args, "to_dict"):  # every hyper-parameter: no bookkeeping fields, no tokens
            record["arguments"] = {name: value for name, value in training_args.to_dict().items()
                                   if name not in NOT_HYPERPARAMETERS and not name.endswith("_token")}
    return {name: getattr(value, "value", value) for name, value in record.items()}  # enums -> "linear"


def training_rows(recorded: dict[str, Any]) -> list[tuple[str, Any]]:
    """`(label, value)` rows of the training arguments the run recorded, unset values spelled out."""
    train = {name: recorded[name] for name in TRAINING_FIELDS if name in recorded}
    train = {k: v for k, v in train.items() if k not in OPTIONAL_TRAINING_FIELDS or v not in (None, False, 0, 0.0)}
    if train.get("hard_negatives") is None:
        train.pop("una_frequency", None)
        train.pop("una_usage", None)
    if not any(train.get(name) for name in ("token_shuffle", "token_cutoff", "feature_cutoff")):
        train.pop("augmentation_views", None)
    if train.get("fgsm_mode") == "off":
        for name in ("fgsm_epsilon", "fgsm_epsilon_unit", "fgsm_views"):
            train.pop(name, None)
    if "bf16" in train:
        train["bf16"] = ("bf16 (autocast; fp32 master weights)" if recorded.get("bf16") else
                         "fp16 (autocast with loss scaling; fp32 master weights)" if recorded.get("fp16") else "no (fp32)")
    if "head_learning_rate" in train and train["head_learning_rate"] is None:
        encoder_rate = recorded.get("learning_rate", "the encoder's")
        train["head_learning_rate"] = f"{encoder_rate} (the encoder's rate, as in the paper)"
    if train.get("fgsm_epsilon_unit") == "absolute":
        train["fgsm_epsilon_unit"] = "absolute (added to the word embeddings as it is)"
    elif train.get("fgsm_epsilon_unit") == "embedding_rms":
        train["fgsm_epsilon_unit"] = "embedding_rms (a fraction of the batch's root-mean-square word-embedding entry)"
    if "max_steps" in train and (train["max_steps"] is None or train["max_steps"] <= 0):
        train.pop("max_steps")  # the epochs decide
    if "load_best_model_at_end" in train:
        metric = recorded.get("metric_for_best_model")
        train["load_best_model_at_end"] = (f"the best by {metric} (load_best_model_at_end)"
                                           if train["load_best_model_at_end"] else "the last step's")
    return [(TRAINING_FIELDS[name], _spelled_out(value)) for name, value in train.items()]


def model_rows(config: dict[str, Any]) -> list[tuple[str, Any]]:
    """`(label, value)` rows of the checkpoint config's model fields; widths left at None give the width used."""
    encoder = config.get("encoder_config") or {}
    hidden = encoder.get("hidden_size") or encoder.get("dim")
    key_width = config.get("projection_dim") or hidden
    rows = []
    for name, label in MODEL_FIELDS.items():
        if name not in config:
            continue
        value = config[name]
        if name == "projection_dim" and value is None:
            value = f"{hidden} (the encoder's hidden size)" if hidden else "the encoder's hidden size"
        elif name == "predictor_dim" and config.get("predictor_layers", 2) < 2:
            value = "– (no hidden block: " + ("no predictor)" if config.get("predictor_layers") == 0 else "one layer)")
        elif name == "predictor_dim" and value is None:
            value = f"{key_width} (the key width)" if key_width else "the key width"
        elif name == "encoder_dropout" and value is None:
            own = encoder.get("hidden_dropout_prob", encoder.get("dropout"))
            value = f"{own} (the encoder's own)" if own is not None else "the encoder's own"
        rows.append((label, _spelled_out(value)))
    return rows


def _spelled_out(value: Any) -> Any:
    """A value as a card cell: None (a field whose meaning has no better words here) is "not set"."""
    return "not set" if value is None else value
