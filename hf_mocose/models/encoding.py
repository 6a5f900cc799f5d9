"""Sentence lengths and sentence embeddings of a loaded `MoCoSEModel`.

Training truncates at `max_seq_length` (32 in the papers); the exported model is used on whole passages, so it
gets, in this order: an explicit `--max_seq_length` / `export_max_seq_length`; the base model's own
sentence-transformers `max_seq_length` (recorded as `base_max_seq_length` when training starts, or read from
the base model if reachable); the encoder's position limit (`resolve_max_length`).
`encode_with_model` serves callers that hold a live model rather than a folder (mid-training STS, the export's
check); `hf-mocose evaluate` encodes with `SentenceTransformer.encode`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def sentence_transformers_max_seq_length(name_or_path: str | os.PathLike | None) -> int | None:
    """The `max_seq_length` a sentence-transformers model (folder or Hub id) declares, read from its Transformer
    module's config (else its tokenizer's `model_max_length`) without loading weights; None when it is not one
    or cannot be read (a folder gone, a Hub id offline)."""
    if not name_or_path:
        return None
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "modules.json")):
        return None  # a plain encoder folder: no need to import sentence-transformers
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.util import load_file_path
    try:
        modules_file = load_file_path(name_or_path, "modules.json")
        modules = json.loads(Path(modules_file).read_text(encoding="utf-8")) if modules_file else []
        subfolder = next((m.get("path", "") for m in modules if m.get("type", "").endswith("Transformer")), None)
        if subfolder is None:
            return None
        module_config = Transformer.load_config(name_or_path, subfolder=subfolder)
        tokenizer_kwargs = module_config.get("processor_kwargs") or module_config.get("tokenizer_args") or {}
        if (length := module_config.get("max_seq_length") or tokenizer_kwargs.get("model_max_length")) is None:
            tokenizer_file = load_file_path(name_or_path, "tokenizer_config.json", subfolder=subfolder)
            if tokenizer_file is not None:
                length = json.loads(Path(tokenizer_file).read_text(encoding="utf-8")).get("model_max_length")
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


def check_length_fits_encoder(name: str, length: int, config, tokenizer, purpose: str) -> int:
    """`length` as an int; a `ValueError` naming `name`, `length` (`purpose`: "for the export", ...) and the limit
    when it is below 2 or above the encoder's (`resolve_max_length`: past it inputs index past the positions)."""
    limit = resolve_max_length(tokenizer, config.encoder_config)
    if not 2 <= length <= limit:
        raise ValueError(f"{name} {length!r} {purpose} is out of range: it must be between 2 and {limit}, the longest "
                         f"input the encoder ({config.encoder_config.model_type}) supports.")
    return int(length)


def inference_max_seq_length(config, tokenizer, max_seq_length: int | None = None) -> tuple[int, str]:
    """`(length, where it came from)` for the export of a model with MoCoSE `config` and `tokenizer`;
    a `ValueError` names a `max_seq_length` out of range (`check_length_fits_encoder`)."""
    if max_seq_length is not None:
        length = check_length_fits_encoder("max_seq_length", max_seq_length, config, tokenizer, "for the export")
        return length, "given explicitly"
    limit = resolve_max_length(tokenizer, config.encoder_config)
    if recorded := getattr(config, "base_max_seq_length", None):
        return min(int(recorded), limit), "the base model's sentence-transformers max_seq_length"
    base = base_model_of(config)
    if found := sentence_transformers_max_seq_length(base):
        return min(found, limit), f"the sentence-transformers max_seq_length of {base}"
    return limit, "the encoder's position limit"


def resolve_max_length(tokenizer, config=None, max_length: int | None = None) -> int:
    """Truncation length: `max_length` if given, else the tokenizer's limit, capped by the model's
    position embeddings (tokenizers often report a huge sentinel value)."""
    # Ours, not the Transformer module's `max_seq_length`: that caps by `max_position_embeddings` without
    # RoBERTa's padding offset (inputs one or two tokens too long), and not at all for a MoCoSE config.
    if max_length:
        return int(max_length)
    limit = getattr(tokenizer, "model_max_length", None) or 512
    limit = 512 if limit > 100_000 else int(limit)
    if positions := getattr(config, "max_position_embeddings", None):
        # RoBERTa-style models reserve padding_idx + 1 positions.
        offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
        limit = min(limit, int(positions) - offset)
    return limit


@torch.no_grad()
def encode_with_model(model, tokenizer, sentences: list[str], batch_size: int = 64,
                      max_length: int | None = None) -> torch.Tensor:
    """`(len(sentences), hidden)` float32 CPU embeddings from ``model.embed``, in order, as sentence-transformers
    encodes (length-sorted batches, eval mode, no gradient), truncated at `max_length` (default: the encoder's
    limit, not the training length). The model stays on its device; its train mode is given back."""
    if not sentences:
        raise ValueError("nothing to encode: the sentence list is empty")
    max_length = resolve_max_length(tokenizer, getattr(model, "online_encoder", model).config, max_length)
    device = next(model.parameters()).device
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))  # longest first, as sentence-transformers
    batches = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            batch = tokenizer([sentences[i] for i in order[start : start + batch_size]], padding=True, truncation=True,
                              max_length=max_length, return_tensors="pt").to(device)
            embeddings = model.embed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
            batches.append(embeddings.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(batches)[torch.tensor(order).argsort()]  # back in the order given


__all__ = ["base_model_of", "check_length_fits_encoder", "encode_with_model", "inference_max_seq_length",
           "resolve_max_length", "sentence_transformers_max_seq_length"]
