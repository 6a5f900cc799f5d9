"""Sentence encoders under evaluation: MoCoSE checkpoints, sentence-transformers folders, plain HF encoders.

Each is loaded as a `SentenceTransformer` and encoded with its `encode` (length-sorted batches, eval mode,
no gradient): a MoCoSE checkpoint as itself (it loads as one: `MoCoSEModel.get_text_features` is `embed`),
a plain encoder as `Transformer` + `Pooling` (+ its pooler's `Dense` for ``cls_dense``), in float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_mocose.models.encoding import resolve_max_length
from hf_mocose.models.pooling import check_sentence_pooling


@dataclass
class Encoder:
    """A loaded encoder: ``encode(sentences) -> (n, dim)`` float32 CPU tensor, plus a description."""

    path: str
    kind: str  # "mocose" | "sentence-transformers" | "hf"
    pooling: str  # the pooling used, or "sentence-transformers" for the folder's own modules
    model: "SentenceTransformer"  # noqa: F821 - imported when an encoder is loaded
    batch_size: int = 64
    show_progress: bool = True

    @property
    def max_length(self) -> int | None:
        """Truncation in tokens."""
        return self.model.max_seq_length

    def encode(self, sentences: list[str]) -> torch.Tensor:
        return self.model.encode(sentences, batch_size=self.batch_size, show_progress_bar=self.show_progress,
                                 convert_to_tensor=True).float().cpu()

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


def load_encoder(
    path: str | Path,
    pooler: str | None = None,
    device: str | torch.device | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    show_progress: bool = True,
) -> Encoder:
    """Loads whatever encoder `path` holds, in eval mode (float32 but for a sentence-transformers folder's own).

    Args:
        path: MoCoSE checkpoint, sentence-transformers folder or plain HF encoder folder.
        pooler: ``cls | cls_dense | mean``. MoCoSE: overrides the checkpoint's sentence_pooling.
            Plain HF: default ``cls``. A sentence-transformers folder given a pooler is read as a plain
            HF encoder (its transformer weights) with that pooler instead of its own modules.
        device: default CUDA when available, else CPU.
        max_length: truncation in tokens; by default the encoder's own limit (whole sentences, as SentEval
            encodes them), not a MoCoSE checkpoint's training `max_seq_length`.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer

    if pooler is not None:
        check_sentence_pooling(pooler)
    device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kind = detect_model_kind(path)
    path = str(path)
    float32 = {"dtype": torch.float32}
    if kind == "sentence-transformers" and pooler is None:
        model = SentenceTransformer(path, device=device)
        if max_length:
            model.max_seq_length = max_length
        return Encoder(path, kind, "sentence-transformers", model.eval(), batch_size, show_progress)
    if kind == "mocose":
        model = SentenceTransformer(path, device=device, model_kwargs=float32)
        mocose = model[0].auto_model
        pooling = mocose.config.sentence_pooling = pooler or mocose.config.sentence_pooling  # `embed` reads it
        encoder_config = mocose.online_encoder.config
    else:  # a plain encoder, or a sentence-transformers folder's transformer weights read as one
        kind, pooling = "hf", pooler or "cls"
        transformer = Transformer(path, model_kwargs=float32)
        modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean" if pooling == "mean" else "cls")]
        if pooling == "cls_dense":
            dense = getattr(getattr(transformer.auto_model, "pooler", None), "dense", None)
            if dense is None:
                raise ValueError(f"--pooler cls_dense needs a pooler dense layer, and {path} has none")
            modules.append(Dense(dense.in_features, dense.out_features, activation_function=torch.nn.Identity(),
                                 init_weight=dense.weight.detach().clone(), init_bias=dense.bias.detach().clone()))
        model = SentenceTransformer(modules=modules, device=device)
        encoder_config = transformer.auto_model.config
    # Not sentence-transformers' own limit: see `resolve_max_length` (RoBERTa's offset, a MoCoSE config).
    model.max_seq_length = resolve_max_length(model.tokenizer, encoder_config, max_length)
    return Encoder(path, kind, pooling, model.eval(), batch_size, show_progress)


__all__ = ["Encoder", "detect_model_kind", "load_encoder"]
