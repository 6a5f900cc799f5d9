"""`hf-mocose export`: a MoCoSE checkpoint as a plain sentence-transformers model (online branch only), with its card.

Built from sentence-transformers' own modules and written by its own `save`: Transformer (online encoder + tokenizer)
-> Pooling ("cls" for sentence_pooling cls / cls_dense, "mean" for mean) -> Dense (the online pooler Linear, identity
activation; only for cls_dense). `max_seq_length` is what the encoder supports at inference (`models.encoding`),
not the (short) training length. The card is parsed back, so bad YAML fails here, not on the Hub.
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

from ..launch.run_folder import failed_save_sentence, tensor_bytes
from ..models.encoding import encode_with_model, inference_max_seq_length
from .model_card import read_eval_results, write_model_card

logger = logging.getLogger(__name__)

# Short sentences to check an export against its checkpoint; `probe_sentences` adds long ones.
PROBE_SENTENCES = ("A man is playing a guitar.", "Momentum contrast keeps a queue of negative keys.", "hi")
_PROBE_PARAGRAPH = "The quick brown fox jumps over the lazy dog, then runs off into the forest before anyone notices. "

# sentence_pooling -> sentence-transformers Pooling mode (cls_dense is CLS followed by a Dense).
POOLING_MODES = {"cls": "cls", "cls_dense": "cls", "mean": "mean"}


def is_mocose_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder with a config.json whose model_type is "mocose"."""
    try:
        return json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("model_type") == "mocose"
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):  # no file, not JSON, not an object
        return False


def load_mocose_checkpoint(checkpoint: str | os.PathLike):
    """`(model, tokenizer)` of a MoCoSE checkpoint folder, eval mode, CPU; errors say what is wrong with it."""
    from transformers import AutoTokenizer

    from ..models.modeling import MoCoSEModel
    from ..launch.checkpoints import check_weights_complete

    path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {str(path)!r} does not exist.")
    if not is_mocose_checkpoint(path):
        found = ("a sentence-transformers folder" if (path / "modules.json").is_file() else "no config.json"
                 if not (path / "config.json").is_file() else "a config.json whose model_type is not 'mocose'")
        raise ValueError(f"{str(path)!r} is not a MoCoSE checkpoint (found {found}). Export expects a folder written "
                         "by MoCoSEModel.save_pretrained / training (config.json with \"model_type\": \"mocose\", "
                         "model.safetensors and the tokenizer files), e.g. <output_dir>/final or "
                         "<output_dir>/checkpoint-N.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"MoCoSE checkpoint {str(path)!r} has no loadable tokenizer ({err}). Save the tokenizer next to "
                         "the model (tokenizer.save_pretrained(checkpoint)); training does this for you.") from err
    check_weights_complete(path, action="export")
    return MoCoSEModel.from_pretrained(path).to("cpu").eval(), tokenizer


def _encoder_class_pooler(model) -> nn.Module | None:
    """The pooler the online encoder's class builds by default, holding the MoCoSE pooler Linear's weights; None when
    the encoder kept its own pooler or has no pooler slot.

    MoCoSE drops the encoder's (Linear + tanh) pooler for its own pooler Linear, which started as that Linear
    (`start_from_pretrained`). Saving the class's pooler with the trained Linear's weights lets every loader (torch,
    ONNX, OpenVINO) build the class with no keyword (`add_pooling_layer=False` breaks optimum's) and no random
    weight; no sentence embedding reads it (they pool `last_hidden_state`)."""
    encoder, linear = model.online_encoder, model.online_pooler
    if getattr(encoder, "pooler", "absent") is not None:  # no pooler attribute, or one that is kept
        return None
    with torch.device("meta"):
        pooler = getattr(type(encoder)(encoder.config), "pooler", None)
    if pooler is None or {k: v.shape for k, v in pooler.state_dict().items()} != {
            "dense.weight": linear.weight.shape, "dense.bias": getattr(linear.bias, "shape", None)}:
        logger.warning("%s's pooler is not a Linear like the MoCoSE pooler: loaders will create a random one. Nothing "
                       "in the export uses it (embeddings come from last_hidden_state).", type(encoder).__name__)
        return None
    pooler = pooler.to_empty(device="cpu").to(linear.weight.dtype)
    pooler.dense.load_state_dict(linear.state_dict())
    return pooler


def build_sentence_transformer(model, tokenizer, staging_dir: str | os.PathLike, max_seq_length: int):
    """The `SentenceTransformer` equivalent of `model.embed` at `max_seq_length`; its encoder saved in `staging_dir`
    (with its class's pooler, see `_encoder_class_pooler`)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    config, encoder = model.config, model.online_encoder
    if (class_pooler := _encoder_class_pooler(model)) is not None:
        encoder.pooler = class_pooler
    try:
        encoder.save_pretrained(staging_dir)
    finally:
        if class_pooler is not None:
            encoder.pooler = None  # as MoCoSE keeps it (its embed runs none)
    tokenizer.save_pretrained(staging_dir)
    hidden = config.hidden_size
    modules = [Transformer(str(staging_dir), max_seq_length=max_seq_length),
               Pooling(hidden, pooling_mode=POOLING_MODES[config.sentence_pooling])]
    if config.sentence_pooling == "cls_dense":
        pooler = model.online_pooler
        modules.append(Dense(hidden, pooler.out_features, bias=pooler.bias is not None,
                             activation_function=nn.Identity(),  # the MoCoSE pooler has no activation
                             init_weight=pooler.weight.detach().clone(),
                             init_bias=None if pooler.bias is None else pooler.bias.detach().clone()))
    return SentenceTransformer(modules=modules, device="cpu", similarity_fn_name="cosine").eval()


def reference_embeddings(model, tokenizer, sentences, max_length: int, batch_size: int = 32) -> torch.Tensor:
    """`model.embed` of `sentences` at `max_length` tokens (what an export must match): `(N, hidden)` float32, CPU."""
    return encode_with_model(model, tokenizer, list(sentences), batch_size=batch_size, max_length=max_length)


def _sentence_of_at_least(tokenizer, n_tokens: int) -> str:
    """A probe sentence that tokenises to at least `n_tokens` tokens (special tokens included)."""
    per_paragraph = len(tokenizer(_PROBE_PARAGRAPH)["input_ids"])
    return (_PROBE_PARAGRAPH * (n_tokens // max(per_paragraph - 2, 1) + 1)).strip()


def probe_sentences(tokenizer, max_seq_length: int, training_length: int) -> list[str]:
    """Probes for an export: the short `PROBE_SENTENCES` (padding), one about twice the training length
    (truncation there would show) and one longer than `max_seq_length` (truncation exactly there)."""
    return [PROBE_SENTENCES[0], _sentence_of_at_least(tokenizer, 2 * training_length), *PROBE_SENTENCES[1:],
            _sentence_of_at_least(tokenizer, max_seq_length + 8)]


def verify_export(export_dir: str | os.PathLike, model, tokenizer, max_seq_length: int, atol: float = 1e-5) -> float:
    """Reloads `export_dir` and compares it with `model.embed` at `max_seq_length` on `probe_sentences`; returns the
    max abs difference. A `RuntimeError` above `atol` (raised, for bf16/fp16, to two rounding steps at the largest
    magnitude) or when the export truncates at another length."""
    from sentence_transformers import SentenceTransformer
    reloaded = SentenceTransformer(str(export_dir), device="cpu")
    sentences = probe_sentences(tokenizer, max_seq_length, model.config.max_seq_length)
    exported = reloaded.encode(sentences, convert_to_tensor=True, batch_size=len(sentences))
    reference = reference_embeddings(model, tokenizer, sentences, max_seq_length)
    diff = (exported.cpu().float() - reference).abs().max().item()
    dtype = next(model.parameters()).dtype
    if dtype in (torch.bfloat16, torch.float16):
        atol = max(atol, 2 * torch.finfo(dtype).eps * reference.abs().max().item())
    if diff > atol:
        raise RuntimeError(f"Export {str(export_dir)!r} differs from the checkpoint's embed() at max_seq_length "
                           f"{max_seq_length} by {diff:.3g} (> {atol}).")
    if reloaded.max_seq_length != max_seq_length:
        raise RuntimeError(f"Export {str(export_dir)!r} truncates at {reloaded.max_seq_length} tokens, expected "
                           f"{max_seq_length}.")
    return diff


def _check_output_dir(output_dir: Path, checkpoint: Path, overwrite: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"Output path {str(output_dir)!r} exists and is not a folder.")
    out, src = output_dir.resolve(), checkpoint.resolve()
    if out == src or out in src.parents:
        # With --overwrite this would delete the checkpoint being exported.
        raise ValueError(f"Output folder {str(output_dir)!r} must not be (or contain) the checkpoint {str(checkpoint)!r}.")
    if src in out.parents:
        # Inside it, the export would become part of the checkpoint (a later push uploads it under mocose/).
        raise ValueError(f"Output folder {str(output_dir)!r} is inside the checkpoint {str(checkpoint)!r}: write the "
                         f"export beside it, e.g. {str(checkpoint.parent / 'sentence-transformers')!r}.")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ValueError(f"Output folder {str(output_dir)!r} exists and is not empty; pass --overwrite (overwrite=True) "
                         "to replace it.")


def export_to_sentence_transformers(checkpoint: str | os.PathLike, output_dir: str | os.PathLike,
                                    overwrite: bool = False, *, max_seq_length: int | None = None,
                                    eval_results: str | os.PathLike | dict | list | None = None, write_card: bool = True,
                                    verify: bool = True, onnx: bool = False, openvino: bool = False,
                                    onnx_arch: str | None = None, stsb_dev_file: str | os.PathLike | None = None,
                                    calibration_file: str | None = None, **card_kwargs) -> Path:
    """Writes the online branch of the MoCoSE checkpoint folder `checkpoint` as a sentence-transformers folder
    `output_dir` (absent or empty unless `overwrite`, which replaces it whole) and returns it. It truncates at
    `max_seq_length` tokens (default: the base model's sentence-transformers `max_seq_length`, else the encoder's
    position limit). `write_card`: README.md (`write_model_card` with `card_kwargs`) with the results of
    `eval_results` (JSON path or dict, or a list of them: `read_eval_results`), which also writes `.eval_results/`
    (`write_eval_results`). `verify`: `verify_export`. `onnx` / `openvino`: the runtime files, checked and measured on
    `stsb_dev_file`, the int8 OpenVINO one calibrated on `calibration_file` (`runtimes.export_runtimes`)."""
    from .eval_results import write_eval_results
    from .runtimes import check_runtime_request, export_runtimes
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    _check_output_dir(output_dir, checkpoint, overwrite)  # before the model is loaded
    results = read_eval_results(eval_results)  # as a bad runtime request, a bad file fails before the model loads
    check_runtime_request(onnx, openvino, onnx_arch, stsb_dev_file, calibration_file)
    model, tokenizer = load_mocose_checkpoint(checkpoint)
    max_seq_length, source = inference_max_seq_length(model.config, tokenizer, max_seq_length)
    logger.info("Export max_seq_length: %d tokens (%s; training used %d).", max_seq_length, source,
                model.config.max_seq_length)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and swap at the end: a failed export leaves the old folder intact.
    staging = output_dir.parent / f".{output_dir.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # (not tempfile.mkdtemp: its 0700 mode would stick to the published folder)
    try:
        # A full disk: one line with the export's size (the online encoder, its pooler, the tokenizer) and the model
        # to export again; the old folder stays as it was.
        again = f"hf-mocose export {checkpoint} {output_dir}{' --overwrite' * overwrite}"
        tokenizer_files = {*tokenizer.vocab_files_names.values(), "tokenizer_config.json", "special_tokens_map.json"}
        size = tensor_bytes(model.online_encoder, model.online_pooler) + sum(
            (checkpoint / name).stat().st_size for name in tokenizer_files if (checkpoint / name).is_file())
        with failed_save_sentence(output_dir, checkpoint.parent, size, written_in=staging,
                                  advice=f"{checkpoint} is whole: free space, then export it again with {again}"):
            build_sentence_transformer(model, tokenizer, staging, max_seq_length).save(str(staging),
                                                                                       create_model_card=False)
            if verify:
                diff = verify_export(staging, model, tokenizer, max_seq_length)
                logger.info("Export matches the checkpoint (max abs difference %.2e).", diff)
            if onnx or openvino:
                card_kwargs["runtimes"] = export_runtimes(
                    staging, probe_sentences(tokenizer, max_seq_length, model.config.max_seq_length), onnx=onnx,
                    openvino=openvino, onnx_arch=onnx_arch, stsb_dev_file=stsb_dev_file,
                    calibration_file=calibration_file)
            write_eval_results(staging, results, card_kwargs.get("repo_id"))
            if write_card:
                card_kwargs.setdefault("export_name", output_dir.name)
                write_model_card(staging, checkpoint=checkpoint, eval_results=eval_results, **card_kwargs)
            if output_dir.exists():
                shutil.rmtree(output_dir)
            staging.rename(output_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return output_dir
