"""Export a MoCoSE checkpoint as a plain sentence-transformers model (online branch only), and the `export` and
`push` sub-commands of `hf-mocose` (`register(subparsers)`):

    hf-mocose export CHECKPOINT OUTPUT_DIR [--overwrite] [--max_seq_length N] [--eval_results results.json]
                     [--repo_id user/name]
    hf-mocose push OUTPUT_DIR --repo_id user/name [--private] [--revision BRANCH] [--commit_message MSG] [--dry_run]

The exported folder is built from sentence-transformers' own modules and written by its own
`save`, so it is exactly what `SentenceTransformer(OUTPUT_DIR)` expects:

    Transformer (online encoder + tokenizer, max_seq_length: the inference length, see below)
      -> Pooling ("cls" for sentence_pooling cls / cls_dense, "mean" for mean)
      -> Dense (the online pooler Linear, identity activation)   only for cls_dense

The target branch, key queue, projection and predictor heads are training machinery and are
left out, as is any optimizer state.

`max_seq_length` is what the encoder supports at inference, not the (short) training length:
the base model's own sentence-transformers setting, else the encoder's position limit, or the
value given (`hf_mocose.models.sequence_length.inference_max_seq_length`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import uuid
from pathlib import Path

import torch
from torch import nn

from ..models.encoding import encode_with_model
from ..models.sequence_length import inference_max_seq_length

logger = logging.getLogger(__name__)

# Short sentences used to check an export against the checkpoint it came from; `probe_sentences`
# adds long ones built for the lengths at hand.
PROBE_SENTENCES = (
    "A man is playing a guitar.",
    "Momentum contrast keeps a queue of negative keys.",
    "hi",
)
_PROBE_PARAGRAPH = "The quick brown fox jumps over the lazy dog, then runs off into the forest before anyone notices. "

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
    (a plain encoder, a sentence-transformers folder, a missing folder) or has no tokenizer, and
    `IncompleteCheckpointError` naming a weights file that was cut short.
    """
    from transformers import AutoTokenizer

    from ..models.modeling import MoCoSEModel
    from ..training.checkpoints import check_weights_complete

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
    check_weights_complete(path, action="export")
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


def build_sentence_transformer(model, tokenizer, staging_dir: str | os.PathLike, max_seq_length: int):
    """Builds the `SentenceTransformer` equivalent of `model.embed` from sentence-transformers modules.

    `staging_dir` receives the encoder and tokenizer, which the `Transformer` module loads from;
    the model truncates its inputs at `max_seq_length` tokens.
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
        max_seq_length=max_seq_length,
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


def reference_embeddings(model, tokenizer, sentences, max_length: int, batch_size: int = 32) -> torch.Tensor:
    """`model.embed` for `sentences`, truncated at `max_length` tokens: what an export with that
    `max_seq_length` must reproduce. Returns `(len(sentences), hidden)` float32 on the CPU."""
    return encode_with_model(model, tokenizer, list(sentences), batch_size=batch_size, max_length=max_length)


def _sentence_of_at_least(tokenizer, n_tokens: int) -> str:
    """A probe sentence that tokenises to at least `n_tokens` tokens (special tokens included)."""
    per_paragraph = len(tokenizer(_PROBE_PARAGRAPH)["input_ids"])
    return (_PROBE_PARAGRAPH * (n_tokens // max(per_paragraph - 2, 1) + 1)).strip()


def probe_sentences(tokenizer, max_seq_length: int, training_length: int) -> list[str]:
    """Sentences to compare an export with its checkpoint on: the short `PROBE_SENTENCES` (padding in a
    batch), one about twice the training length (truncation at the training length would show) and
    one longer than `max_seq_length` (truncation at exactly `max_seq_length` is exercised)."""
    long_ones = [_sentence_of_at_least(tokenizer, 2 * training_length), _sentence_of_at_least(tokenizer, max_seq_length + 8)]
    return [PROBE_SENTENCES[0], long_ones[0], *PROBE_SENTENCES[1:], long_ones[1]]


def verify_export(export_dir: str | os.PathLike, model, tokenizer, max_seq_length: int, atol: float = 1e-5) -> float:
    """Reloads `export_dir` with `SentenceTransformer` and compares it with `model.embed` at `max_seq_length`, on
    probes longer than the training length and than `max_seq_length` (an export truncating elsewhere fails).

    Returns the max abs difference; a `RuntimeError` above `atol` or when the reloaded `max_seq_length` differs
    (a broken export must not be published). A bf16/fp16 model computes in that precision on both sides, along
    different paths: two of its rounding steps at the embeddings' largest magnitude are allowed then.
    """
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
        raise RuntimeError(
            f"Export {str(export_dir)!r} differs from the checkpoint's embed() at max_seq_length {max_seq_length} "
            f"by {diff:.3g} (> {atol})."
        )
    if reloaded.max_seq_length != max_seq_length:
        raise RuntimeError(
            f"Export {str(export_dir)!r} truncates at {reloaded.max_seq_length} tokens, expected {max_seq_length}."
        )
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
        raise ValueError(
            f"Output folder {str(output_dir)!r} exists and is not empty; pass --overwrite (overwrite=True) to replace it."
        )


def export_to_sentence_transformers(checkpoint: str | os.PathLike, output_dir: str | os.PathLike,
                                    overwrite: bool = False, *, max_seq_length: int | None = None,
                                    eval_results: str | os.PathLike | dict | None = None, write_card: bool = True,
                                    verify: bool = True, **card_kwargs) -> Path:
    """Writes a sentence-transformers model folder of the checkpoint's online branch; returns the folder.

    Args:
        checkpoint: a MoCoSE checkpoint folder (config.json + model.safetensors + tokenizer).
        output_dir: the folder to write; absent or empty unless `overwrite` (which replaces it whole, so no
            stale module folder survives).
        max_seq_length: tokens the export truncates its inputs at. Default: the base model's sentence-transformers
            `max_seq_length`, else the encoder's position limit (`hf_mocose.models.sequence_length`), not the
            training length.
        eval_results: evaluation JSON (path or dict) whose results go into the model card.
        write_card: write README.md from the `model_cards/` template (`write_model_card`).
        verify: reload the export and check it matches `model.embed` at `max_seq_length` within 1e-5.
        **card_kwargs: passed to `write_model_card` (repo_id, base_model, datasets, template, facts...).
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    _check_output_dir(output_dir, checkpoint, overwrite)  # before the model is loaded
    model, tokenizer = load_mocose_checkpoint(checkpoint)
    max_seq_length, source = inference_max_seq_length(model.config, tokenizer, max_seq_length)
    logger.info("Export max_seq_length: %d tokens (%s; training used %d).", max_seq_length, source,
                model.config.max_seq_length)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and swap at the end: a failed export leaves the old folder intact.
    staging = output_dir.parent / f".{output_dir.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # (not tempfile.mkdtemp: its 0700 mode would stick to the published folder)
    try:
        st_model, model_kwargs = build_sentence_transformer(model, tokenizer, staging, max_seq_length)
        st_model.save(str(staging), create_model_card=False)
        if model_kwargs:
            # sentence-transformers reads `model_kwargs` from this file when loading but does not
            # write the ones the module was built with; without it the pooler comes back random.
            config_path = staging / "sentence_bert_config.json"
            module_config = json.loads(config_path.read_text(encoding="utf-8"))
            module_config["model_kwargs"] = model_kwargs
            config_path.write_text(json.dumps(module_config, indent=2) + "\n", encoding="utf-8")
        if verify:
            diff = verify_export(staging, model, tokenizer, max_seq_length)
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


# ----------------------------------------------------------------------------- the sub-commands
def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `export` and `push` to the `hf-mocose` parser."""
    export = subparsers.add_parser(
        "export",
        help="Export a MoCoSE checkpoint as a sentence-transformers model folder with a model card.",
        description="Writes the online branch of CHECKPOINT as a sentence-transformers model (Transformer -> "
        "Pooling [-> Dense for cls_dense]) plus README.md, and checks it reproduces the checkpoint's embeddings.",
    )
    export.add_argument("checkpoint", help="MoCoSE checkpoint folder (e.g. <output_dir>/final).")
    export.add_argument("output_dir", help="Folder to write; must be absent or empty unless --overwrite.")
    export.add_argument("--overwrite", action="store_true", help="Replace a non-empty OUTPUT_DIR.")
    export.add_argument("--max_seq_length", type=int, default=None,
                        help="Tokens the exported model truncates its inputs at (default: the base model's "
                        "sentence-transformers max_seq_length, else the encoder's position limit; not the training "
                        "length).")
    export.add_argument("--eval_results", default=None, help="Evaluation JSON (hf-mocose evaluate) for the card.")
    export.add_argument("--repo_id", default=None, help="Hub repo the card's usage snippets should name.")
    export.add_argument("--base_model", default=None, help="Hub id of the starting encoder (default: from the config).")
    export.add_argument("--dataset", dest="datasets", action="append", default=[],
                        help="Hub dataset id of the training corpus (repeatable); goes into the card metadata.")
    export.add_argument("--corpus", default=None, help="Free-text description of the training corpus for the card.")
    export.add_argument("--language", default="en", help="Card language code (default: en).")
    export.add_argument("--license", default="apache-2.0", help="Card license (default: apache-2.0).")
    export.add_argument("--template", default=None, help="Custom Jinja card template (file, or a name in model_cards/).")
    export.add_argument("--no_card", action="store_true", help="Do not write README.md.")
    export.set_defaults(func=run_export)

    push = subparsers.add_parser(
        "push",
        help="Upload an exported folder to the Hugging Face Hub.",
        description="Creates the repo if needed and uploads OUTPUT_DIR to its root with huggingface_hub. The token "
        "comes from HF_TOKEN or `hf auth login`.",
    )
    push.add_argument("output_dir", help="Folder written by `hf-mocose export`.")
    push.add_argument("--repo_id", required=True, help="Target repo, 'namespace/name'.")
    push.add_argument("--private", action="store_true", help="Create the repo as private (ignored if it exists).")
    push.add_argument("--revision", default=None, help="Branch to push to (created if missing; default: main).")
    push.add_argument("--commit_message", default=None, help="Commit message.")
    push.add_argument("--dry_run", action="store_true", help="List what would be uploaded; send nothing.")
    push.set_defaults(func=run_push)


def run_export(args: argparse.Namespace) -> int:
    card_kwargs = {}
    if not args.no_card:
        card_kwargs = dict(
            repo_id=args.repo_id, base_model=args.base_model, datasets=args.datasets, corpus=args.corpus,
            language=args.language, license=args.license, template=args.template,
        )
        if args.repo_id:
            from .hub import validate_repo_id

            validate_repo_id(args.repo_id)
    out = export_to_sentence_transformers(
        args.checkpoint, args.output_dir, overwrite=args.overwrite, max_seq_length=args.max_seq_length,
        eval_results=args.eval_results, write_card=not args.no_card, **card_kwargs,
    )
    print(f"Exported {args.checkpoint} to {out} (load it with SentenceTransformer({str(out)!r})).")
    return 0


def run_push(args: argparse.Namespace) -> int:
    from .hub import HubPushError, push_export

    try:
        result = push_export(
            args.output_dir, args.repo_id, private=args.private or None, revision=args.revision,
            commit_message=args.commit_message, dry_run=args.dry_run,
        )
    except HubPushError as err:
        print(f"hf-mocose push: error: {err}", file=sys.stderr)
        return 1
    if args.dry_run:
        total = sum(size for _, size in result)
        print(f"Dry run: would upload {len(result)} files ({total} bytes) to {args.repo_id} "
              f"({args.revision or 'main'}); nothing was sent.")
        for path, size in result:
            print(f"  {path}\t{size}")
        return 0
    print(f"Pushed {args.output_dir} to {args.repo_id}: {result}")
    return 0
