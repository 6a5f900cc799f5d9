"""Sentence encoders under evaluation: MoCoSE checkpoints, sentence-transformers folders, plain HF encoders.

All of them are driven the same way: length-sorted batches, fp32, ``model.eval()`` and
``torch.no_grad()``, so that numbers do not depend on dropout or on the order sentences arrive in.
The batching itself (`encode_batches`, `encode_with_model`, `resolve_max_length`) lives in the core
module `hf_mocose.models.encoding`; it is re-exported here for existing imports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from hf_mocose.models.encoding import (
    encode_batches,
    encode_with_model,
    length_sorted_order,
    mocose_embed,
    pooled_embed,
    resolve_max_length,
)
from hf_mocose.models.pooling import SENTENCE_POOLING_MODES, check_sentence_pooling


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
        from hf_mocose.models.modeling import MoCoSEModel
    except ImportError as err:  # pragma: no cover - only while modeling.py is missing
        raise ValueError(f"this is a MoCoSE checkpoint but hf_mocose.models.modeling cannot be imported: {err}") from err
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
            embed = mocose_embed(model)
        else:
            encoder, dense = model.online_encoder, model.online_pooler
            embed = pooled_embed(encoder, pooling, dense)
        config = model.online_encoder.config  # whole sentences by default, not the training max_seq_length
    else:
        pooling = pooler or "cls"
        model = AutoModel.from_pretrained(path).to(device, torch.float32).eval()
        dense = None
        if pooling == "cls_dense":
            dense = getattr(getattr(model, "pooler", None), "dense", None)
            if dense is None:
                raise ValueError(f"--pooler cls_dense needs a pooler dense layer, and {path} has none")
        embed = pooled_embed(model, pooling, dense)
        config = model.config
    max_length = resolve_max_length(tokenizer, config, max_length)

    def hf_encode(sentences, batch_size=64, show_progress=False, desc="encoding"):
        return encode_batches(embed, tokenizer, sentences, device, batch_size, max_length, show_progress, desc)

    return Encoder(path, kind, pooling, hf_encode, batch_size, show_progress, max_length)


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
