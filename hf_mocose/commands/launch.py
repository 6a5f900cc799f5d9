"""`hf-mocose train`: a recipe trained in the processes `accelerate launch` starts, as TRL's `trl sft` does.

    hf-mocose train RECIPE [--field value ...] [--accelerate_config NAME|PATH] [--num_processes N] [launch flags]

RECIPE is a recipe's name (`hf-mocose recipes`) or a YAML path; `--accelerate_config` a launcher config's name or a
path (`commands.recipes`), `default` (one process) unless it or accelerate's `--config_file` is given. Each process runs
`hf_mocose.commands.train` (`scripts/train.py`'s overrides, refusals and printed lines): `accelerate launch [flags] -m
hf_mocose.commands.train RECIPE ...` is the same run under your own accelerate config. A flag `accelerate launch` knows
and the training arguments do not (`--num_processes`, `--multi_gpu`, `--machine_rank`, ...) goes to the launcher;
names both know (`--gradient_accumulation_steps`, `--debug`) are training's, as in TRL.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from .recipes import ACCELERATE_CONFIGS, print_recipes, resolve_yaml

TRAIN_MODULE = "hf_mocose.commands.train"
USAGE = ("usage: hf-mocose train RECIPE [--field value ...] [--accelerate_config NAME|PATH] [--num_processes N] "
         "[accelerate launch flags]\n       hf-mocose train --list | RECIPE --help | --help_all")


def split_arguments(argv: list[str], launcher, training) -> tuple[list[str], list[str]]:
    """`(accelerate launch's arguments, the training arguments)`: see the module docstring. A launcher flag takes
    the next argument as its value unless it takes none (`--multi_gpu`) or comes as `--flag=value`."""
    launch, train, i = [], [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        action = None if flag in training._option_string_actions else launcher._option_string_actions.get(flag)
        taken = 1 if "=" in argv[i] or (action is not None and action.nargs == 0) else 2
        if flag == "--accelerate_config" or action is not None:
            launch += argv[i:i + taken]
            i += taken
        else:
            train.append(argv[i])
            i += 1
    return launch, train


def with_config_file(launch: list[str]) -> list[str]:
    """`--accelerate_config NAME|PATH` as accelerate's `--config_file PATH`; `default` when neither is given."""
    named = [i for i, arg in enumerate(launch) if arg.split("=", 1)[0] == "--accelerate_config"]
    if any(arg.split("=", 1)[0] in ("--config_file", "--config-file") for arg in launch):
        if named:
            raise ValueError("give one launcher config: --accelerate_config NAME|PATH or --config_file PATH.")
        return launch
    value, rest = "default", launch
    if named:
        i, inline = named[0], "=" in launch[named[0]]
        value = launch[i].split("=", 1)[1] if inline else (launch[i + 1] if i + 1 < len(launch) else "")
        rest = launch[:i] + launch[i + (1 if inline else 2):]
    return ["--config_file", str(resolve_yaml(value, ACCELERATE_CONFIGS, "Accelerate config")), *rest]


def launch_training(argv: list[str]) -> int:
    """Starts the processes; returns the run's exit status (a refusal's 2, said once by the main process)."""
    if "--list" in argv or not argv or argv[0] in ("-h", "--help"):
        if "--list" not in argv:
            print(USAGE + "\n")
        print_recipes()
        return 0 if argv else 2
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from transformers import HfArgumentParser

    from ..trainer.training_args import MoCoSETrainingArguments
    from .train import ScriptArguments, parse_args

    launcher = launch_command_parser()
    launch, train = split_arguments(argv, launcher, HfArgumentParser((ScriptArguments, MoCoSETrainingArguments)))
    if {"-h", "--help", "--help_all"} & set(train):
        print(USAGE + "\n")
        sys.argv[:1] = ["hf-mocose train"]  # argparse's prog
        parse_args(train)  # prints the options with the recipe's values and exits
    try:
        launch_command(launcher.parse_args([*with_config_file(launch), "--module", TRAIN_MODULE, *train]))
    except subprocess.CalledProcessError as err:  # one process, which has said why
        return err.returncode
    except ChildFailedError as err:  # several: the main process has said why
        return max(err.get_first_failure()[1].exitcode, 1)
    return 0


def register(subparsers) -> None:
    # "+" prefixes nothing here: everything after `train` (recipe, fields, launch flags) is forwarded as it is.
    train = subparsers.add_parser("train", add_help=False, prefix_chars="+", usage=USAGE[len("usage: "):],
                                  help="train a recipe in the processes accelerate launch starts (--help: options)")
    train.add_argument("argv", nargs=argparse.REMAINDER)
    train.set_defaults(func=lambda args: launch_training(args.argv))
