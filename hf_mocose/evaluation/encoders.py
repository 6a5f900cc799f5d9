"""Sentence encoders under evaluation: MoCoSE checkpoints, sentence-transformers folders, plain HF encoders.

All of them are driven the same way: length-sorted batches, fp32, ``model.eval()`` and
``torch.no_grad()``, so that numbers do not depend on dropout or on the order sentences arrive in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from hf_mocose.pooling import SENTENCE_POOLING_MODES, check_sentence_pooling, pool_sentence_embedding

# (input_ids, attention_mask, token_type_ids or None) -> (batch, hidden)
EmbedFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def length_sorted_order(sentences: list[str]) -> list[int]:
    """Indices of `sentences`, longest first: batches of similar length waste little padding,
    and the longest (most memory-hungry) batch comes first so an out-of-memory error shows at once."""
    return sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))


def resolve_max_length(tokenizer, config=None, max_length: int | None = None) -> int:
    """Truncation length: `max_length` if given, else the tokenizer's limit, capped by the model's
    position embeddings (tokenizers often report a huge sentinel value)."""
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
def encode_batches(
    embed: EmbedFn,
    tokenizer,
    sentences: list[str],
    device: torch.device,
    batch_size: int = 64,
    max_length: int = 512,
    show_progress: bool = False,
    desc: str = "encoding",
) -> torch.Tensor:
    """Encodes `sentences` with `embed` in length-sorted batches.

    Returns:
        `(len(sentences), hidden)` float32 CPU tensor, rows in the order of `sentences`.
    """
    from tqdm.auto import tqdm

    if not sentences:
        raise ValueError("nothing to encode: the sentence list is empty")
    order = length_sorted_order(sentences)
    out: list[torch.Tensor] = [None] * len(sentences)  # type: ignore[list-item]
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not show_progress, unit="batch"):
        idx = order[start : start + batch_size]
        batch = tokenizer(
            [sentences[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        token_type_ids = batch.get("token_type_ids")
        emb = embed(
            batch["input_ids"].to(device),
            batch["attention_mask"].to(device),
            None if token_type_ids is None else token_type_ids.to(device),
        )
        emb = emb.float().cpu()
        for row, i in enumerate(idx):
            out[i] = emb[row]
    return torch.stack(out)


def _accepts_token_types(encoder: nn.Module) -> bool:
    """DistilBERT-style encoders take no token_type_ids even when the tokenizer returns them."""
    import inspect

    return "token_type_ids" in inspect.signature(encoder.forward).parameters


def _mocose_embed(model) -> EmbedFn:
    keep_tt = _accepts_token_types(getattr(model, "online_encoder", model))
    return lambda ids, mask, tt: model.embed(ids, mask, token_type_ids=tt if keep_tt else None)


def _device_of(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def encode_with_model(
    model,
    tokenizer,
    sentences: list[str],
    batch_size: int = 64,
    max_length: int | None = None,
    show_progress: bool = False,
) -> torch.Tensor:
    """Sentence embeddings from a MoCoSE model (``model.embed``: online encoder + its sentence_pooling).

    Sentences are truncated at `max_length`, by default the encoder's own limit (whole sentences, as
    SentEval encodes them), not the training `max_seq_length`. The model stays on its device; its
    train/eval mode is restored afterwards, so the trainer can call this mid-training.

    Returns:
        `(len(sentences), hidden)` float32 CPU tensor.
    """
    was_training = model.training
    model.eval()
    try:
        max_length = resolve_max_length(tokenizer, getattr(model, "online_encoder", model).config, max_length)
        return encode_batches(
            _mocose_embed(model),
            tokenizer,
            sentences,
            _device_of(model),
            batch_size=batch_size,
            max_length=max_length,
            show_progress=show_progress,
        )
    finally:
        model.train(was_training)


@dataclass
class Encoder:
    """A loaded encoder: ``encode(sentences) -> (n, dim)`` float32 CPU tensor, plus a description."""

    path: str
    kind: str  # "mocose" | "sentence-transformers" | "hf"
    pooling: str  # the pooling used, or "sentence-transformers" for the folder's own modules
    encode_fn: Callable[..., torch.Tensor]
    batch_size: int = 64
    show_progress: bool = True
    max_length: int | None = None  # truncation in tokens

    def encode(self, sentences: list[str], desc: str = "encoding") -> torch.Tensor:
        return self.encode_fn(sentences, batch_size=self.batch_size, show_progress=self.show_progress, desc=desc)

    def describe(self) -> dict:
        return {"path": self.path, "kind": self.kind, "pooling": self.pooling, "max_length": self.max_length}


def detect_model_kind(path: str | Path) -> str:
    """``"mocose"`` (config.json model_type mocose), ``"sentence-transformers"`` (modules.json) or ``"hf"``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"model path {path} does not exist; give a MoCoSE checkpoint, a sentence-transformers folder "
            "or a Hugging Face encoder folder"
        )
    if not path.is_dir():
        raise ValueError(f"model path {path} is a file; give the model folder")
    config = path / "config.json"
    if config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except json.JSONDecodeError as err:
            raise ValueError(f"{config} is not valid JSON: {err}") from err
        if model_type == "mocose":
            return "mocose"
    if (path / "modules.json").is_file():
        return "sentence-transformers"
    if config.is_file():
        return "hf"
    raise ValueError(
        f"{path} is not a model folder: expected a MoCoSE checkpoint (config.json with \"model_type\": "
        "\"mocose\"), a sentence-transformers folder (modules.json) or a Hugging Face encoder (config.json)"
    )


def _import_mocose_model():
    try:
        from hf_mocose.modeling import MoCoSEModel
    except ImportError as err:  # pragma: no cover - only while modeling.py is missing
        raise ValueError(f"this is a MoCoSE checkpoint but hf_mocose.modeling cannot be imported: {err}") from err
    return MoCoSEModel


def load_encoder(
    path: str | Path,
    pooler: str | None = None,
    device: str | torch.device | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    show_progress: bool = True,
) -> Encoder:
    """Loads whatever encoder `path` holds, in eval mode and fp32.

    Args:
        path: MoCoSE checkpoint, sentence-transformers folder or plain HF encoder folder.
        pooler: ``cls | cls_dense | mean``. MoCoSE: overrides the checkpoint's sentence_pooling.
            Plain HF: default ``cls``. A sentence-transformers folder given a pooler is read as a plain
            HF encoder (its transformer weights) with that pooler instead of its own modules.
        device: default CUDA when available, else CPU.
    """
    from transformers import AutoModel, AutoTokenizer

    if pooler is not None:
        check_sentence_pooling(pooler)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kind = detect_model_kind(path)
    path = str(path)

    if kind == "sentence-transformers" and pooler is None:
        from sentence_transformers import SentenceTransformer

        st_model = SentenceTransformer(path, device=str(device))
        st_model.eval()
        if max_length:
            st_model.max_seq_length = max_length

        def st_encode(sentences, batch_size=64, show_progress=False, desc=""):
            # sentence-transformers sorts by length itself and runs under no_grad in eval mode.
            emb = st_model.encode(
                sentences, batch_size=batch_size, show_progress_bar=show_progress, convert_to_tensor=True
            )
            return emb.float().cpu()

        return Encoder(path, kind, "sentence-transformers", st_encode, batch_size, show_progress, st_model.max_seq_length)

    if kind == "sentence-transformers":  # with a pooler: its transformer weights, read as a plain encoder
        kind = "hf"
    tokenizer = AutoTokenizer.from_pretrained(path)
    if kind == "mocose":
        model = _import_mocose_model().from_pretrained(path).to(device, torch.float32).eval()
        pooling = pooler or model.config.sentence_pooling
        if pooling == model.config.sentence_pooling:
            embed = _mocose_embed(model)
        else:
            encoder, dense = model.online_encoder, model.online_pooler
            embed = _pooled_embed(encoder, pooling, dense)
        config = model.online_encoder.config  # whole sentences by default, not the training max_seq_length
    else:
        pooling = pooler or "cls"
        model = AutoModel.from_pretrained(path).to(device, torch.float32).eval()
        dense = None
        if pooling == "cls_dense":
            dense = getattr(getattr(model, "pooler", None), "dense", None)
            if dense is None:
                raise ValueError(f"--pooler cls_dense needs a pooler dense layer, and {path} has none")
        embed = _pooled_embed(model, pooling, dense)
        config = model.config
    max_length = resolve_max_length(tokenizer, config, max_length)

    def hf_encode(sentences, batch_size=64, show_progress=False, desc="encoding"):
        return encode_batches(embed, tokenizer, sentences, device, batch_size, max_length, show_progress, desc)

    return Encoder(path, kind, pooling, hf_encode, batch_size, show_progress, max_length)


def _pooled_embed(encoder: nn.Module, pooling: str, dense: nn.Linear | None) -> EmbedFn:
    """Embedding function: `encoder`'s last hidden state pooled with the shared pooling code."""
    takes_token_types = _accepts_token_types(encoder)

    def embed(ids, mask, token_type_ids):
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if token_type_ids is not None and takes_token_types:
            kwargs["token_type_ids"] = token_type_ids
        hidden = encoder(**kwargs).last_hidden_state  # (batch, seq, hidden)
        return pool_sentence_embedding(hidden, mask, pooling, dense=dense)

    return embed


__all__ = [
    "SENTENCE_POOLING_MODES",
    "Encoder",
    "detect_model_kind",
    "encode_batches",
    "encode_with_model",
    "length_sorted_order",
    "load_encoder",
    "resolve_max_length",
]
