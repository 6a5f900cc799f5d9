"""The `export` and `push` sub-commands of `hf-mocose` (registered through `register(subparsers)`).

    hf-mocose export CHECKPOINT OUTPUT_DIR [--overwrite] [--max_seq_length N] [--eval_results results.json [dim64.json ...]]
                     [--repo_id user/name] [--onnx [--onnx_arch ARCH]] [--openvino [--calibration_file FILE]]
                     [--stsb_dev_file sts-dev.csv]
    hf-mocose push OUTPUT_DIR --repo_id user/name [--private] [--revision BRANCH] [--commit_message MSG] [--dry_run]
"""

from __future__ import annotations

import argparse
import sys

from .runtimes import CALIBRATION_SENTENCES, QUANTIZED_WEIGHTS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `export` and `push` to the `hf-mocose` parser."""
    export = subparsers.add_parser(
        "export", help="Export a MoCoSE checkpoint as a sentence-transformers model folder with a model card.",
        description="Writes the online branch of CHECKPOINT as a sentence-transformers model (Transformer -> "
        "Pooling [-> Dense for cls_dense]) plus README.md, and checks it reproduces the checkpoint's embeddings.")
    export.add_argument("checkpoint", help="MoCoSE checkpoint folder (e.g. <output_dir>/final).")
    export.add_argument("output_dir", help="Folder to write; must be absent or empty unless --overwrite.")
    export.add_argument("--overwrite", action="store_true", help="Replace a non-empty OUTPUT_DIR.")
    export.add_argument("--max_seq_length", type=int, default=None,
                        help="Tokens the exported model truncates its inputs at (default: the base model's "
                        "sentence-transformers max_seq_length, else the encoder's position limit; not the training "
                        "length).")
    export.add_argument("--eval_results", nargs="+", default=None, help="Evaluation JSON (hf-mocose evaluate) for "
                        "the card; with Matryoshka widths, also one per width (hf-mocose evaluate --truncate_dim N).")
    export.add_argument("--repo_id", default=None, help="Hub repo the card's usage snippets should name.")
    export.add_argument("--base_model", default=None, help="Hub id of the starting encoder (default: from the config).")
    export.add_argument("--dataset", dest="datasets", action="append", default=[],
                        help="Hub dataset id of the training corpus (repeatable); goes into the card metadata.")
    export.add_argument("--corpus", default=None, help="Free-text description of the training corpus for the card.")
    export.add_argument("--language", default="en", help="Card language code (default: en).")
    export.add_argument("--license", default="apache-2.0", help="Card license (default: apache-2.0).")
    export.add_argument("--template", default=None, help="Custom Jinja card template (file, or a name in model_cards/).")
    export.add_argument("--no_card", action="store_true", help="Do not write README.md.")
    export.add_argument("--onnx", action="store_true", help="Also write onnx/model.onnx (fp32) and its dynamic int8 "
                        "quantization, each checked against PyTorch and measured in the card (the `onnx` extra).")
    export.add_argument("--onnx_arch", choices=sorted(QUANTIZED_WEIGHTS), default=None,
                        help="CPU the int8 file is quantized for, as sentence-transformers names them (default: this one).")
    export.add_argument("--openvino", action="store_true", help="Also write openvino/openvino_model.xml/.bin (fp32 "
                        "weights, run at OpenVINO's default precision) and NNCF's static int8 of it, checked and measured "
                        "(the `openvino` extra).")
    export.add_argument("--calibration_file", default=None, help="The run's training sentences (a train_file), whose "
                        f"first {CALIBRATION_SENTENCES} calibrate the int8 OpenVINO file (default: builtin:python_docs).")
    export.add_argument("--stsb_dev_file", default=None, help="SentEval's sts-dev.csv: the card's runtime table shows "
                        "each file's STS-B dev Spearman, a bf16 or int8 way losing over 1 point is not written.")
    export.set_defaults(func=run_export)

    push = subparsers.add_parser(
        "push", help="Upload an exported folder to the Hugging Face Hub.",
        description="Creates the repo if needed and uploads OUTPUT_DIR to its root with huggingface_hub. The token "
        "comes from HF_TOKEN or `hf auth login`.")
    push.add_argument("output_dir", help="Folder written by `hf-mocose export`.")
    push.add_argument("--repo_id", required=True, help="Target repo, 'namespace/name'.")
    push.add_argument("--private", action="store_true", help="Create the repo as private (ignored if it exists).")
    push.add_argument("--revision", default=None, help="Branch to push to (created if missing; default: main).")
    push.add_argument("--commit_message", default=None, help="Commit message.")
    push.add_argument("--dry_run", action="store_true", help="List what would be uploaded; send nothing.")
    push.set_defaults(func=run_push)


def run_export(args: argparse.Namespace) -> int:
    from .export import export_to_sentence_transformers
    if args.repo_id and not args.no_card:
        from .hub import validate_repo_id
        validate_repo_id(args.repo_id)
    card_kwargs = {} if args.no_card else dict(
        repo_id=args.repo_id, base_model=args.base_model, datasets=args.datasets, corpus=args.corpus,
        language=args.language, license=args.license, template=args.template)
    out = export_to_sentence_transformers(args.checkpoint, args.output_dir, overwrite=args.overwrite,
                                          max_seq_length=args.max_seq_length, eval_results=args.eval_results,
                                          write_card=not args.no_card, onnx=args.onnx, openvino=args.openvino,
                                          onnx_arch=args.onnx_arch, stsb_dev_file=args.stsb_dev_file,
                                          calibration_file=args.calibration_file, **card_kwargs)
    print(f"Exported {args.checkpoint} to {out} (load it with SentenceTransformer({str(out)!r})).")
    return 0


def run_push(args: argparse.Namespace) -> int:
    from .hub import HubPushError, push_export
    try:
        result = push_export(args.output_dir, args.repo_id, private=args.private or None, revision=args.revision,
                             commit_message=args.commit_message, dry_run=args.dry_run)
    except HubPushError as err:
        print(f"hf-mocose push: error: {err}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"Dry run: would upload {len(result)} files ({sum(size for _, size in result)} bytes) to {args.repo_id} "
              f"({args.revision or 'main'}); nothing was sent.")
        for path, size in result:
            print(f"  {path}\t{size}")
        return 0
    print(f"Pushed {args.output_dir} to {args.repo_id}: {result}")
    return 0
