"""Export a MoCoSE checkpoint as a plain sentence-transformers model (online branch only).

    hf-mocose export CHECKPOINT OUTPUT_DIR [--overwrite] [--eval_results results.json]

The exported folder is built from sentence-transformers' own modules and written by its own
`save`, so it is exactly what `SentenceTransformer(OUTPUT_DIR)` expects:

    Transformer (online encoder + tokenizer, max_seq_length from training)
      -> Pooling ("cls" for sentence_pooling cls / cls_dense, "mean" for mean)
      -> Dense (the online pooler Linear, identity activation)   only for cls_dense

The target branch, key queue, projection and predictor heads are training machinery and are
left out, as is any optimizer state.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Sentences used to check an export against the checkpoint it came from: short and long ones,
# so truncation at max_seq_length and padding inside a batch are both exercised.
PROBE_SENTENCES = (
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog, then runs off into the forest before anyone notices. " * 4,
    "Momentum contrast keeps a queue of negative keys.",
    "hi",
)

# sentence_pooling -> sentence-transformers Pooling mode (cls_dense is CLS followed by a Dense).
POOLING_MODES = {"cls": "cls", "cls_dense": "cls", "mean": "mean"}


def is_mocose_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder with a config.json whose model_type is "mocose"."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "mocose"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def load_mocose_checkpoint(checkpoint: str | os.PathLike):
    """Loads `(model, tokenizer)` from a MoCoSE checkpoint folder, in eval mode on the CPU.

    Raises `FileNotFoundError` / `ValueError` naming the path when it is not a MoCoSE checkpoint
    (a plain encoder, a sentence-transformers folder, a missing folder) or has no tokenizer.
    """
    from transformers import AutoTokenizer

    from .modeling import MoCoSEModel

    path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {str(path)!r} does not exist.")
    if not is_mocose_checkpoint(path):
        found = "a sentence-transformers folder" if (path / "modules.json").is_file() else (
            "no config.json" if not (path / "config.json").is_file() else "a config.json whose model_type is not 'mocose'"
        )
        raise ValueError(
            f"{str(path)!r} is not a MoCoSE checkpoint (found {found}). Export expects a folder written by "
            "MoCoSEModel.save_pretrained / training (config.json with \"model_type\": \"mocose\", model.safetensors "
            "and the tokenizer files), e.g. <output_dir>/final or <output_dir>/checkpoint-N."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(
            f"MoCoSE checkpoint {str(path)!r} has no loadable tokenizer ({err}). Save the tokenizer next to the "
            "model (tokenizer.save_pretrained(checkpoint)); training does this for you."
        ) from err
    model = MoCoSEModel.from_pretrained(path).to("cpu").eval()
    return model, tokenizer


def _encoder_load_kwargs(encoder: nn.Module) -> dict:
    """Keyword arguments AutoModel needs to rebuild `encoder` without a randomly initialised part.

    MoCoSE drops the encoder's own pooler (it has its own Linear), so the saved weights have
    none. BERT-like classes would rebuild it with random weights (and warn); they accept
    `add_pooling_layer=False`, which makes the reloaded model exactly the exported one.
    """
    import inspect

    if getattr(encoder, "pooler", "absent") is not None:  # no pooler attribute, or one that is kept
        return {}
    if "add_pooling_layer" in inspect.signature(type(encoder).__init__).parameters:
        return {"add_pooling_layer": False}
    logger.warning(
        "%s has a pooler slot but no add_pooling_layer option: AutoModel will create a random pooler on "
        "load. Nothing in the export uses it (embeddings come from last_hidden_state).",
        type(encoder).__name__,
    )
    return {}


def build_sentence_transformer(model, tokenizer, staging_dir: str | os.PathLike):
    """Builds the `SentenceTransformer` equivalent of `model.embed` from sentence-transformers modules.

    `staging_dir` receives the encoder and tokenizer, which the `Transformer` module loads from.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer

    config = model.config
    encoder = model.online_encoder
    model_kwargs = _encoder_load_kwargs(encoder)
    encoder.save_pretrained(staging_dir)
    tokenizer.save_pretrained(staging_dir)
    transformer = Transformer(
        str(staging_dir),
        max_seq_length=config.max_seq_length,
        model_kwargs=model_kwargs or None,
    )
    hidden = config.hidden_size
    modules = [transformer, Pooling(hidden, pooling_mode=POOLING_MODES[config.sentence_pooling])]
    if config.sentence_pooling == "cls_dense":
        pooler = model.online_pooler
        modules.append(
            Dense(
                hidden,
                pooler.out_features,
                bias=pooler.bias is not None,
                activation_function=nn.Identity(),  # the MoCoSE pooler has no activation
                init_weight=pooler.weight.detach().clone(),
                init_bias=None if pooler.bias is None else pooler.bias.detach().clone(),
            )
        )
    st_model = SentenceTransformer(modules=modules, device="cpu", similarity_fn_name="cosine")
    return st_model.eval(), model_kwargs


@torch.no_grad()
def reference_embeddings(model, tokenizer, sentences, batch_size: int = 32) -> torch.Tensor:
    """`model.embed` for `sentences`: what the export must reproduce (truncation at max_seq_length)."""
    model.eval()
    out = []
    for start in range(0, len(sentences), batch_size):
        batch = tokenizer(
            list(sentences[start : start + batch_size]),
            padding=True,
            truncation=True,
            max_length=model.config.max_seq_length,
            return_tensors="pt",
        )
        out.append(model.embed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")))
    return torch.cat(out)


def verify_export(export_dir: str | os.PathLike, model, tokenizer, atol: float = 1e-5) -> float:
    """Reloads `export_dir` with `SentenceTransformer` and compares it with `model.embed`.

    Returns the max abs difference; raises `RuntimeError` above `atol` (a broken export must not
    be published).
    """
    from sentence_transformers import SentenceTransformer

    reloaded = SentenceTransformer(str(export_dir), device="cpu")
    sentences = list(PROBE_SENTENCES)
    exported = reloaded.encode(sentences, convert_to_tensor=True, batch_size=len(sentences))
    diff = (exported.cpu() - reference_embeddings(model, tokenizer, sentences)).abs().max().item()
    if diff > atol:
        raise RuntimeError(f"Export {str(export_dir)!r} differs from the checkpoint by {diff:.3g} (> {atol}).")
    return diff


def _check_output_dir(output_dir: Path, checkpoint: Path, overwrite: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"Output path {str(output_dir)!r} exists and is not a folder.")
    out, src = output_dir.resolve(), checkpoint.resolve()
    if out == src or out in src.parents:
        # With --overwrite this would delete the checkpoint being exported.
        raise ValueError(f"Output folder {str(output_dir)!r} must not be (or contain) the checkpoint {str(checkpoint)!r}.")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ValueError(
            f"Output folder {str(output_dir)!r} exists and is not empty; pass --overwrite (overwrite=True) to replace it."
        )


def export_to_sentence_transformers(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    overwrite: bool = False,
    *,
    eval_results: str | os.PathLike | dict | None = None,
    write_card: bool = True,
    verify: bool = True,
    **card_kwargs,
) -> Path:
    """Writes a sentence-transformers model folder of the checkpoint's online branch.

    Args:
        checkpoint: a MoCoSE checkpoint folder (config.json + model.safetensors + tokenizer).
        output_dir: the folder to write; must be absent or empty unless `overwrite`.
        overwrite: replace a non-empty `output_dir` (its old contents are removed, so no stale
            module folder survives).
        eval_results: evaluation JSON (path or dict) whose STS results go into the model card.
        write_card: write README.md from the `model_cards/` template (see `write_model_card`).
        verify: reload the export and check it matches `model.embed` within 1e-5.
        **card_kwargs: passed to `write_model_card` (repo_id, base_model, datasets, template...).

    Returns:
        The export folder.
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    model, tokenizer = load_mocose_checkpoint(checkpoint)
    _check_output_dir(output_dir, checkpoint, overwrite)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and swap at the end: a failed export leaves the old folder intact.
    staging = output_dir.parent / f".{output_dir.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # (not tempfile.mkdtemp: its 0700 mode would stick to the published folder)
    try:
        st_model, model_kwargs = build_sentence_transformer(model, tokenizer, staging)
        st_model.save(str(staging), create_model_card=False)
        if model_kwargs:
            # sentence-transformers reads `model_kwargs` from this file when loading but does not
            # write the ones the module was built with; without it the pooler comes back random.
            config_path = staging / "sentence_bert_config.json"
            module_config = json.loads(config_path.read_text(encoding="utf-8"))
            module_config["model_kwargs"] = model_kwargs
            config_path.write_text(json.dumps(module_config, indent=2) + "\n", encoding="utf-8")
        if verify:
            diff = verify_export(staging, model, tokenizer)
            logger.info("Export matches the checkpoint (max abs difference %.2e).", diff)
        if write_card:
            from .model_card import write_model_card

            card_kwargs.setdefault("export_name", output_dir.name)
            write_model_card(staging, checkpoint=checkpoint, eval_results=eval_results, **card_kwargs)
        if output_dir.exists():
            shutil.rmtree(output_dir)
        staging.rename(output_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return output_dir
