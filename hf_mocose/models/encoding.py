"""Sentence lengths and sentence embeddings of a loaded `MoCoSEModel`.

Lengths. The sequence length an exported model truncates at when it is used, as opposed to the training length.

Training truncates every sentence at `MoCoSEConfig.max_seq_length` (32 in the papers) for speed.
The exported sentence-transformers model is used on whole sentences and passages, so it gets the
length the encoder supports at inference instead, in this order:

1. an explicit value (`hf-mocose export --max_seq_length N`, `export_max_seq_length` in training);
2. the base model's own sentence-transformers `max_seq_length` (256 for all-MiniLM-L6-v2), recorded
   in the checkpoint's config as `base_max_seq_length` when training starts, so that the export does
   not need the base model folder; for checkpoints without it, read from the base model if it can
   still be reached;
3. the encoder's position limit (`resolve_max_length`: the tokenizer's `model_max_length` capped by
   the position embeddings, minus RoBERTa's padding offset).

Embeddings. `hf-mocose evaluate` encodes with `SentenceTransformer.encode` (`evaluation/runner.py`). This module
serves the callers that hold a model object rather than a folder: the trainer's STS evaluation (mid-training)
and the export's check against `MoCoSEModel.embed`. Like sentence-transformers: length-sorted batches,
``model.eval()``, no gradient; the embeddings come back in float32.
"""

from __future__ import annotations

import json
import logging
import os

import torch

logger = logging.getLogger(__name__)


def sentence_transformers_max_seq_length(name_or_path: str | os.PathLike | None) -> int | None:
    """The `max_seq_length` a sentence-transformers model (folder or Hub id) declares, or None.

    None when `name_or_path` is not a sentence-transformers model (no `modules.json`) or cannot be
    read (a folder that no longer exists, a Hub id while offline). Read from the Transformer
    module's `sentence_bert_config.json` (`max_seq_length`, as in all-MiniLM-L6-v2), else from its
    tokenizer's `model_max_length` (what sentence-transformers >= 6 saves), without loading weights.
    """
    if not name_or_path:
        return None
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "modules.json")):
        return None  # a plain encoder folder: no need to import sentence-transformers
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.util import load_file_path

    try:
        modules_file = load_file_path(name_or_path, "modules.json")
        if modules_file is None:
            return None
        with open(modules_file, encoding="utf-8") as handle:
            modules = json.load(handle)
        subfolder = next((m.get("path", "") for m in modules if m.get("type", "").endswith("Transformer")), None)
        if subfolder is None:
            return None
        module_config = Transformer.load_config(name_or_path, subfolder=subfolder)
        tokenizer_kwargs = module_config.get("processor_kwargs") or module_config.get("tokenizer_args") or {}
        length = module_config.get("max_seq_length") or tokenizer_kwargs.get("model_max_length")
        if length is None:
            tokenizer_file = load_file_path(name_or_path, "tokenizer_config.json", subfolder=subfolder)
            if tokenizer_file is not None:
                with open(tokenizer_file, encoding="utf-8") as handle:
                    length = json.load(handle).get("model_max_length")
    except Exception as err:  # unreachable or malformed: the caller falls back to the position limit
        logger.warning("Could not read the sentence-transformers settings of %r (%s).", name_or_path, err)
        return None
    if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= 100_000:
        return None  # absent, or transformers' "no limit" sentinel
    return length


def base_model_of(config) -> str | None:
    """The base model a MoCoSE config was built from: `base_model_name_or_path` if the config carries
    it, else the path the encoder config was loaded from (`encoder_config._name_or_path`)."""
    return getattr(config, "base_model_name_or_path", None) or getattr(config.encoder_config, "_name_or_path", None) or None


def encoder_length_limit(config, tokenizer) -> int:
    """The longest input, in tokens, the encoder of a model with MoCoSE `config` supports: the tokenizer's
    `model_max_length` capped by the position embeddings (`resolve_max_length`)."""
    return resolve_max_length(tokenizer, config.encoder_config)


def check_length_fits_encoder(name: str, length: int, config, tokenizer, purpose: str) -> int:
    """`length` as an int; a `ValueError` naming `name`, `length` and the limit when it is below 2 or above
    `encoder_length_limit` (inputs that long would index past the position embeddings).

    `purpose` says what the length is for in the message ("for the export", "for training", ...).
    """
    limit = encoder_length_limit(config, tokenizer)
    if not 2 <= length <= limit:
        raise ValueError(
            f"{name} {length!r} {purpose} is out of range: it must be between 2 and {limit}, the longest input "
            f"the encoder ({config.encoder_config.model_type}) supports."
        )
    return int(length)


def inference_max_seq_length(config, tokenizer, max_seq_length: int | None = None) -> tuple[int, str]:
    """`(length, where it came from)` for the export of a model with MoCoSE `config` and `tokenizer`.

    Raises a `ValueError` naming `max_seq_length` when it is below 2 or above the encoder's position
    limit (`check_length_fits_encoder`).
    """
    if max_seq_length is not None:
        length = check_length_fits_encoder("max_seq_length", max_seq_length, config, tokenizer, "for the export")
        return length, "given explicitly"
    limit = encoder_length_limit(config, tokenizer)
    recorded = getattr(config, "base_max_seq_length", None)
    if recorded:
        return min(int(recorded), limit), "the base model's sentence-transformers max_seq_length"
    base = base_model_of(config)
    found = sentence_transformers_max_seq_length(base)
    if found:
        return min(found, limit), f"the sentence-transformers max_seq_length of {base}"
    return limit, "the encoder's position limit"


__all__ = ["base_model_of", "check_length_fits_encoder", "encoder_length_limit", "inference_max_seq_length",
           "sentence_transformers_max_seq_length"]


def resolve_max_length(tokenizer, config=None, max_length: int | None = None) -> int:
    """Truncation length: `max_length` if given, else the tokenizer's limit, capped by the model's
    position embeddings (tokenizers often report a huge sentinel value)."""
    # Ours, not the Transformer module's `max_seq_length`: that caps by `max_position_embeddings` without
    # RoBERTa's padding offset (inputs one or two tokens too long), and not at all for a MoCoSE config.
    if max_length:
        return int(max_length)
    limit = getattr(tokenizer, "model_max_length", None) or 512
    limit = 512 if limit > 100_000 else int(limit)
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style models reserve padding_idx + 1 positions.
        offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
        limit = min(limit, int(positions) - offset)
    return limit


@torch.no_grad()
def encode_with_model(model, tokenizer, sentences: list[str], batch_size: int = 64,
                      max_length: int | None = None) -> torch.Tensor:
    """Sentence embeddings from a MoCoSE model (``model.embed``: online encoder + its sentence_pooling).

    Sentences are truncated at `max_length`, by default the encoder's own limit (whole sentences, as
    SentEval encodes them), not the training `max_seq_length`. The model stays on its device; its
    train/eval mode is restored afterwards, so the trainer can call this mid-training.

    Returns:
        `(len(sentences), hidden)` float32 CPU tensor, rows in the order of `sentences`.
    """
    # Ours, not `SentenceTransformer.encode`: its Transformer module loads a model from a folder; it cannot
    # take the live model the trainer is training (on its device, unwrapped, its train mode given back).
    if not sentences:
        raise ValueError("nothing to encode: the sentence list is empty")
    max_length = resolve_max_length(tokenizer, getattr(model, "online_encoder", model).config, max_length)
    device = next(model.parameters()).device
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))  # longest first, as sentence-transformers
    out: list[torch.Tensor] = [None] * len(sentences)  # type: ignore[list-item]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = tokenizer([sentences[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt").to(device)
            embeddings = model.embed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
            for row, i in zip(embeddings.float().cpu(), idx):
                out[i] = row
    finally:
        model.train(was_training)
    return torch.stack(out)


__all__ = ["encode_with_model", "resolve_max_length"]
