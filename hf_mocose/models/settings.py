"""The method settings, each declared once: name, type, default, help text, card label, and who takes it.

`METHOD_SETTINGS` is the one description. Everything else is generated from it:

* `MoCoSEConfig`'s method fields (`model=True`): its keyword arguments, defaults and `config.json` entries;
* `MoCoSETrainingArguments`' fields (`args=True`), with their `--help` (`trainer/training_args.py`
  makes a dataclass of them, `MethodSettingsArguments`, and mixes it in);
* `MoCoSELoss`'s keyword arguments (`loss=True`) and its signature (`with_keywords`);
* the model card's rows (`label`; the card reads a model field's value from `config.json`);
* one validation (`take_settings` / `validate_settings`), so every front end refuses the same values in
  the same words, before any model is built or any step is taken.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .heads import HEAD_INITS
from .pooling import SENTENCE_POOLING_MODES, check_sentence_pooling

METHODS = ("mocose", "simcse", "ifcl", "esimcse")
# What the EMA target shares with the online encoder: its word embeddings only (hf-mocose's default), or
# its whole embedding module (word, position and token-type embeddings and their LayerNorm: the paper's
# Figure 2 and the reference code, whose target reads the online embedding layer's output).
SHARED_EMBEDDINGS = ("word", "module")
# K_s when none is given: the paper's 128 (of K = 512), capped at the queue the user chose, so that
# `queue_size=64` alone is a valid setting (the queue then starts full of random keys). Every paper
# recipe and ablation grid sets `queue_init_size` itself.
DEFAULT_QUEUE_INIT_SIZE = 128
# ESimCSE's dup_rate for BERT-base (the authors' run.sh, caskcsg/sentemb ESimCSE/): word repetition's rate when
# `word_repetition_rate` is None and the method is esimcse (0 = off for the other methods).
ESIMCSE_REPETITION_RATE = 0.32

# FGSM's choices (`hf_mocose.models.objective.FGSMPerturbation` runs them).
FGSM_MODES = ("previous", "exact", "off")
FGSM_VIEWS = ("both", "online")
FGSM_EPSILON_UNITS = ("absolute", "embedding_rms")


@dataclass(frozen=True)
class Setting:
    """One method setting: the keyword `name`, its `type` (as `HfArgumentParser` reads it) and `default`."""

    name: str
    type: Any
    default: Any
    help: str  # the `--help` text
    # `method`, `model`, `queue`, `target`, `fgsm` or `optimizer`: the card shows the `target`/`fgsm` rows first
    # among the training arguments, the `optimizer` one by the learning rate.
    group: str
    label: str | None = None  # the model card's row label; None = no row
    model: bool = True  # a `MoCoSEConfig` field (saved in `config.json`)
    args: bool = True  # a `MoCoSETrainingArguments` field
    loss: bool = True  # a `MoCoSELoss` keyword
    doc: str = ""  # what the generated docstrings (`describe`) add to `help`


def _s(type_, default, help_, group, label=None, *, model=True, loss=True, doc="") -> dict[str, Any]:
    return dict(type=type_, default=default, help=help_, group=group, label=label, model=model, loss=loss, doc=doc)


# name -> the rest of its `Setting`, in the order the model card lists them (then the training-only ones).
_DECLARED = {
    "method": _s(
        str, "mocose", f"Training method: {', '.join(METHODS)}.", "method", "method",
        doc="`mocose`: online branch vs EMA target branch with a negative queue. `simcse`: two dropout views of the "
            "online encoder, in-batch negatives, no target, no queue, no predictor. `ifcl`: SimCSE's two views plus a "
            "\"hippocampus\" queue of past online anchors weighted by forgetting coefficients (no target, no predictor). "
            "`esimcse`: SimCSE's online views, the positive a word-repeated copy, plus a queue of a momentum (EMA) "
            "encoder's embeddings of past anchors (no predictor; Wu et al., COLING 2022)."),
    "sentence_pooling": _s(
        str, "cls", f"Sentence embedding trained, evaluated and exported: {', '.join(SENTENCE_POOLING_MODES)} (the "
        "heads read the [CLS] state, or the token mean for mean).", "model", "sentence pooling (exported)", loss=False,
        doc="`cls` is the last-layer [CLS] state before the pooler Linear (what the paper evaluates), `cls_dense` "
            "after it, `mean` the masked mean of the token states (for encoders deployed with mean pooling)."),
    "max_seq_length": _s(
        int, 32, "Tokens per sentence in training; longer ones are truncated. The sentence-transformers export "
        "truncates at the encoder's inference length instead (see export_max_seq_length).", "model",
        "training sequence length (tokens)", loss=False),
    "contrastive_temperature": _s(
        float, 0.05, "InfoNCE temperature tau > 0.", "method", "temperature τ",
        doc="Named so that `generation_config` checks leave it alone."),
    "queue_size": _s(
        int, 512, "K: capacity of the negative-key queue.", "queue", "queue size K",
        doc="MoCoSELoss: at most the number of training rows."),
    "queue_init_size": _s(
        int | None, None, "K_s: random unit vectors the queue starts with; default min(128, queue_size).", "queue",
        "initial queue size K_s (random keys)",
        doc="None is resolved when the settings are read (`resolve_queue_init_size`), never more than the queue holds."),
    "in_batch_negatives": _s(
        bool, True, "Use the other keys of the global batch as negatives too.", "method", "in-batch negatives"),
    "word_repetition_rate": _s(
        float | None, None, "Word repetition (ESimCSE): the positive is its sentence with up to min(10, int(rate x "
        "tokens)) - 1 random tokens doubled in place; 0 = off; None = 0.32 for esimcse, 0 otherwise.", "method",
        "word repetition rate (positive view)", model=False,
        doc="Drawn as the authors' code (dup_type bpe): neither [CLS] nor [SEP], after truncation."),
    "projection_layers": _s(
        int, 1, "Projection blocks (Linear+LayerNorm+Dropout).", "model", "projection layers",
        doc="After the pooler; 0 = none."),
    "predictor_layers": _s(
        int, 2, "Predictor depth; last block Linear+Tanh; 0 = none.", "model", "predictor layers",
        doc="(n-1) Linear + LayerNorm + Dropout blocks, then Linear + Tanh, on the online branch."),
    "predictor_dim": _s(int | None, None, "Predictor width; default the key width.", "model", "predictor width"),
    "projection_dim": _s(
        int | None, None, "Output width of the projection = width of keys, queries and queue (the reference code's "
        "out_size, the paper's Table 6a); default hidden size; needs projection_layers >= 1.", "model",
        "projection (key and queue) width", loss=False,
        doc="The sentence embedding (`sentence_pooling`) is read before the heads and keeps the hidden size."),
    "head_init": _s(
        str, "identity", f"Head Linear initialisation: {', '.join(HEAD_INITS)} (random = the paper's).", "model",
        "head initialisation",
        doc="For the head Linears a checkpoint does not provide (projection, predictor, and the pooler when the "
            "encoder has none). `random`: normal(0, initializer_range), as the paper. `identity`: identity matrices "
            "and zero biases, so that at step 0 the query is tanh(LayerNorm(key)) up to dropout (docs/quality.md)."),
    "head_dropout": _s(float, 0.1, "Dropout in projection and predictor blocks.", "model", "head dropout"),
    "encoder_dropout": _s(float | None, 0.1, "Encoder dropout rate (the dropout augmentation); None keeps the "
                          "checkpoint's.", "model", "encoder dropout", loss=False,
                          doc="Set on the encoder's hidden and attention dropout."),
    "target_dropout": _s(bool, True, "Run the target branch with dropout in training.", "target",
                         "target branch dropout", doc="The reference code does."),
    "shared_embeddings": _s(
        str, "word", f"What the EMA target shares with the online encoder: {', '.join(SHARED_EMBEDDINGS)} (word = "
        "word embeddings only; module = the whole embedding module, copied after every step, as the paper's Figure 2 "
        "and the reference code). MoCoSE only.", "target", "embeddings shared with the target", loss=False,
        doc="With `word` the target's position/token-type embeddings and embedding LayerNorm follow the EMA like the "
            "rest of it; with `module` they are copied from the online encoder after every optimizer step."),
    "fraternal_fusion": _s(float, 0.5, "IFCL fusion rate epsilon: epsilon*y + (1-epsilon)*y_fraternal, in [0, 1].",
                           "method", loss=False),
    "ifcl_forgetting": _s(float, 0.1, "IFCL lambda: queue entry m weighs 1 - lambda * ceil(m / batch); in [0, 1).",
                          "queue", model=False, doc="Used by method `ifcl` only."),
    "ema_decay_start": _s(float, 0.75, "EMA decay eta at the first optimizer step, in [0, 1].", "target",
                          "EMA decay η at the first step", model=False),
    "ema_decay_end": _s(float, 0.95, "EMA decay eta at the end of the cosine ramp, in [0, 1].", "target",
                        "EMA decay η at the end of the cosine ramp", model=False),
    "ema_decay_horizon": _s(
        int | None, None, "Optimizer steps the cosine ramp takes, eta staying at ema_decay_end after; default: the run "
        "length. The reference code's schedule: start 0.75, end 1.0, horizon 15000.", "target",
        "EMA ramp length (optimizer steps)", model=False),
    "fgsm_mode": _s(
        str, "previous", f"FGSM on word embeddings: {', '.join(FGSM_MODES)}.", "fgsm", "FGSM mode", model=False,
        doc="`previous`: the last step's gradient sign (fitted to each batch's padded length); `exact`: one extra "
            "forward/backward."),
    "fgsm_epsilon": _s(float, 5e-9, "FGSM step size epsilon >= 0, in fgsm_epsilon_unit.", "fgsm", "FGSM epsilon",
                       model=False),
    "fgsm_epsilon_unit": _s(
        str, "absolute", f"Unit of fgsm_epsilon: {', '.join(FGSM_EPSILON_UNITS)} (a fraction of the batch's "
        "root-mean-square word-embedding entry); absolute = the paper's.", "fgsm", "FGSM epsilon unit", model=False),
    "fgsm_views": _s(str, "both", f"Which branches see the perturbation: {', '.join(FGSM_VIEWS)}.", "fgsm",
                     "FGSM perturbed branches", model=False),
    "matryoshka_dims": _s(
        list[int] | None, None, "Matryoshka: also train the first d dimensions of the keys, queries and queue at each d "
        "listed (descending, the first the full key width, e.g. 384 128 64); the loss is the weighted sum of InfoNCE at "
        "each; None = off.", "method", "Matryoshka dimensions", model=False,
        doc="One forward per step; the queue keeps full keys, truncated (and re-normalised) per dimension, like the "
            "query, its key and the other processes' gathered keys (`models.objective`, docs/methods.md)."),
    "matryoshka_weights": _s(
        list[float] | None, None, "Weights of the matryoshka_dims losses, one per dimension; None = all 1.", "method",
        "Matryoshka weights", model=False),
    "head_learning_rate": _s(
        float | None, 1e-3, "Learning rate of the online heads (pooler, projection, predictor); null = learning_rate "
        "(the paper's).", "optimizer", "learning rate of the heads (pooler, projection, predictor)", model=False,
        doc="MoCoSELoss hands it to the optimiser as `learning_rate_mapping={\"online_head\\\\.\": rate}`."),
}
METHOD_SETTINGS: tuple[Setting, ...] = tuple(Setting(name, **rest) for name, rest in _DECLARED.items())
SETTINGS = MappingProxyType({setting.name: setting for setting in METHOD_SETTINGS})
MODEL_SETTINGS = tuple(s for s in METHOD_SETTINGS if s.model)
ARGS_SETTINGS = tuple(s for s in METHOD_SETTINGS if s.args)
LOSS_SETTINGS = tuple(s for s in METHOD_SETTINGS if s.loss)
# Both front ends' shared settings, under one name with one default.
METHOD_DEFAULTS = MappingProxyType({s.name: s.default for s in LOSS_SETTINGS})


def resolve_queue_init_size(queue_init_size: int | None, queue_size: int) -> int:
    """K_s: `queue_init_size`, or when it is None `min(128, queue_size)` (never more than the queue holds)."""
    return min(DEFAULT_QUEUE_INIT_SIZE, max(queue_size, 0)) if queue_init_size is None else queue_init_size


def take_settings(given: dict[str, Any], settings: tuple[Setting, ...]) -> dict[str, Any]:
    """The values of `settings`, popped from `given` or their defaults, `queue_init_size` resolved, validated."""
    values = {s.name: given.pop(s.name, s.default) for s in settings}
    if values.get("word_repetition_rate", 0) is None:
        values["word_repetition_rate"] = ESIMCSE_REPETITION_RATE if _get(values, "method") == "esimcse" else 0.0
    if "queue_init_size" in values:
        values["queue_init_size"] = resolve_queue_init_size(values["queue_init_size"], _get(values, "queue_size"))
    validate_settings(values)
    return values


def _get(values: dict[str, Any], name: str) -> Any:
    return values.get(name, SETTINGS[name].default)


def _choice(values: dict[str, Any], name: str, choices: tuple[str, ...]) -> str:
    if (value := _get(values, name)) not in choices:
        raise ValueError(f"Unknown {name} {value!r}; choose one of {', '.join(choices)}.")
    return value


def validate_settings(values: dict[str, Any]) -> None:
    """Raises a `ValueError` naming the offending value for any impossible method setting in `values`
    (settings it leaves out are taken at their defaults)."""
    method = _choice(values, "method", METHODS)
    check_sentence_pooling(_get(values, "sentence_pooling"))
    temperature = _get(values, "contrastive_temperature")
    if not temperature > 0:
        raise ValueError(f"contrastive_temperature (tau) must be > 0, got {temperature!r}.")
    queue_size = _get(values, "queue_size")
    init_size = resolve_queue_init_size(values.get("queue_init_size"), queue_size)
    if method in ("mocose", "ifcl", "esimcse"):
        if queue_size < 1:
            raise ValueError(f"queue_size (K) must be >= 1, got {queue_size!r}.")
        if not 0 <= init_size <= queue_size:
            raise ValueError(f"queue_init_size (K_s) must be between 0 and queue_size={queue_size}, got {init_size!r}.")
    if method == "simcse" and not _get(values, "in_batch_negatives"):
        raise ValueError("method='simcse' has no queue: it needs in_batch_negatives=True.")
    if (rate := values.get("word_repetition_rate")) is not None and not 0.0 <= rate <= 1.0:
        raise ValueError(f"word_repetition_rate must be in [0, 1], got {rate!r}.")
    for name in ("projection_layers", "predictor_layers"):
        if values.get(name, 0) < 0:
            raise ValueError(f"{name} must be >= 0, got {values[name]!r}.")
    if (predictor_dim := values.get("predictor_dim")) is not None and predictor_dim < 1:
        raise ValueError(f"predictor_dim must be >= 1 (or None for the hidden size), got {predictor_dim!r}.")
    if (projection_dim := values.get("projection_dim")) is not None:
        if isinstance(projection_dim, bool) or not isinstance(projection_dim, int) or projection_dim < 1:
            raise ValueError(f"projection_dim must be a whole number >= 1 (or None for the hidden size), "
                             f"got {projection_dim!r}.")
        if values.get("projection_layers", 1) == 0:
            raise ValueError(f"projection_dim={projection_dim} needs projection_layers >= 1: the last projection "
                             "Linear sets the key width (with no projection the keys keep the encoder's width).")
    if (shared := _choice(values, "shared_embeddings", SHARED_EMBEDDINGS)) != "word" and method != "mocose":
        raise ValueError(f"shared_embeddings={shared!r} concerns the EMA target branch, which only method='mocose' "
                         f"has (got method={method!r}).")
    _choice(values, "head_init", HEAD_INITS)
    if not 0 <= _get(values, "head_dropout") < 1:
        raise ValueError(f"head_dropout must be in [0, 1), got {values['head_dropout']!r}.")
    if (encoder_dropout := values.get("encoder_dropout")) is not None and not 0 <= encoder_dropout < 1:
        raise ValueError(f"encoder_dropout must be in [0, 1), got {encoder_dropout!r}.")
    fusion = _get(values, "fraternal_fusion")
    if not 0.0 <= fusion <= 1.0:
        raise ValueError(f"fraternal_fusion (epsilon) must be in [0, 1], got {fusion!r}.")
    if (max_len := _get(values, "max_seq_length")) is not None and max_len < 2:
        raise ValueError(f"max_seq_length must be >= 2, got {max_len!r}.")
    # The settings of the training run, not of the model: the EMA schedule, FGSM and the heads' learning rate.
    for name in ("ema_decay_start", "ema_decay_end"):
        if not 0.0 <= _get(values, name) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {values[name]!r}.")
    horizon = _get(values, "ema_decay_horizon")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ValueError(f"ema_decay_horizon must be a whole number of optimizer steps >= 1 (or None for the "
                         f"run length), got {horizon!r}.")
    for name, choices in (("fgsm_mode", FGSM_MODES), ("fgsm_views", FGSM_VIEWS),
                          ("fgsm_epsilon_unit", FGSM_EPSILON_UNITS)):
        _choice(values, name, choices)
    if _get(values, "fgsm_epsilon") < 0:
        raise ValueError(f"fgsm_epsilon must be >= 0, got {values['fgsm_epsilon']!r}.")
    if not 0.0 <= _get(values, "ifcl_forgetting") < 1.0:
        raise ValueError(f"ifcl_forgetting (lambda) must be in [0, 1), got {values['ifcl_forgetting']!r}.")
    _check_matryoshka(_get(values, "matryoshka_dims"), _get(values, "matryoshka_weights"))
    if (rate := _get(values, "head_learning_rate")) is not None and not rate > 0:
        raise ValueError(f"head_learning_rate must be > 0 (or None for learning_rate), got {rate!r}.")


def _check_matryoshka(dims, weights) -> None:
    if dims is None:
        if weights is not None:
            raise ValueError(f"matryoshka_weights={list(weights)!r} needs matryoshka_dims.")
        return
    dims = list(dims)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims) or any(
            a <= b for a, b in zip(dims, dims[1:])):
        raise ValueError(f"matryoshka_dims must be whole numbers >= 1 in descending order, the first the full key "
                         f"width (e.g. [384, 128, 64]), got {dims!r}.")
    if weights is not None and (len(weights) != len(dims) or any(not w > 0 for w in weights)):
        raise ValueError(f"matryoshka_weights must be {len(dims)} numbers > 0, one per matryoshka_dims entry, "
                         f"got {list(weights)!r}.")


def with_keywords(settings: tuple[Setting, ...], more: bool = True):
    """Decorates an `__init__(self, ..., **kwargs)` that takes `settings` from its `**kwargs`: its signature
    (`help()`, `inspect.signature`) then lists them as keyword-only parameters with their defaults, and keeps
    `**kwargs` only if it takes `more` keywords than those."""
    def decorate(init):
        signature, keyword_only = inspect.signature(init), inspect.Parameter.KEYWORD_ONLY
        params = [p for p in signature.parameters.values() if more or p.kind is not inspect.Parameter.VAR_KEYWORD]
        keywords = [inspect.Parameter(s.name, keyword_only, default=s.default, annotation=s.type) for s in settings]
        first_keyword = next((i for i, p in enumerate(params) if p.kind >= inspect.Parameter.KEYWORD_ONLY), len(params))
        init.__signature__ = signature.replace(parameters=[*params[:first_keyword], *keywords, *params[first_keyword:]])
        return init
    return decorate


def describe(settings: tuple[Setting, ...], indent: int = 4, mark_model: bool = False) -> str:
    """Docstring entries of `settings`, in order: `name (`type`, defaults to `default`):` then its help and doc;
    `mark_model` marks the `MoCoSEConfig` fields *(model)*."""
    lines = []
    for s in settings:
        type_name = getattr(s.type, "__name__", None) or str(s.type).replace("NoneType", "None")
        model = "*(model)* " if mark_model and s.model else ""
        text = " ".join(part for part in (model + s.help, s.doc) if part)
        lines.append(" " * indent + f"{s.name} (`{type_name}`, defaults to `{s.default!r}`):")
        lines += textwrap.wrap(text, 112, initial_indent=" " * (indent + 4), subsequent_indent=" " * (indent + 4),
                               break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines)
