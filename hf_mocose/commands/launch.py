"""`hf-mocose train`: a recipe trained in the processes `accelerate launch` starts, as TRL's `trl sft` does.

    hf-mocose train RECIPE [--field value ...] [--accelerate_config NAME|PATH] [--num_processes N] [launch flags]

RECIPE is a recipe's name (`hf-mocose recipes`) or a YAML path; `--accelerate_config` a launcher config's name or a
path (`commands.recipes`), `default` (one process) unless it or accelerate's `--config_file` is given. Each process runs
`hf_mocose.commands.train` (`scripts/train.py`'s overrides, refusals and printed lines): `accelerate launch [flags] -m
hf_mocose.commands.train RECIPE ...` is the same run under your own accelerate config. A flag `accelerate launch` knows
and the training arguments do not (`--num_processes`, `--multi_gpu`, `--machine_rank`, ...) goes to the launcher;
names both know (`--gradient_accumulation_steps`, `--debug`) are training's, as in TRL.

accelerate's launcher runs in a child process of its own session (`python -m hf_mocose.commands.launch`), so that
neither a Ctrl-C at the terminal nor a signal to `hf-mocose train` reaches torch elastic's agent, which would stop
the training processes itself (SIGKILL after 30 s, a traceback). SIGTERM, SIGUSR1 and SIGINT are forwarded to the
training processes instead (a stop request, `launch.stop_request`), once each has installed its handlers; the
launcher waits for them, however long their save takes, and returns their status (75 for a stopped run). If
`hf-mocose train` itself dies (SIGKILL), the child gets SIGTERM from the kernel and forwards it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

from .recipes import ACCELERATE_CONFIGS, print_recipes, resolve_yaml

TRAIN_MODULE = "hf_mocose.commands.train"
LAUNCHER_PID_ENV = "HF_MOCOSE_LAUNCHER_PID"  # the child's parent: gone already means the run was stopped
FORWARD_INTERVAL_S = 0.2
AGENT_SIGNALS = "SIGHUP,SIGQUIT"  # what torch elastic's agent handles in `hf-mocose train`'s child
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
    from accelerate.commands.launch import launch_command_parser
    from transformers import HfArgumentParser

    from ..trainer.training_args import MoCoSETrainingArguments
    from .train import ScriptArguments, parse_args

    launcher = launch_command_parser()
    launch, train = split_arguments(argv, launcher, HfArgumentParser((ScriptArguments, MoCoSETrainingArguments)))
    if {"-h", "--help", "--help_all"} & set(train):
        print(USAGE + "\n")
        sys.argv[:1] = ["hf-mocose train"]  # argparse's prog
        parse_args(train)  # prints the options with the recipe's values and exits
    arguments = [*with_config_file(launch), "--module", TRAIN_MODULE, *train]
    launcher.parse_args(arguments)  # a launcher flag's mistake is accelerate's own message, here
    return run_launcher(arguments)


def _catches_stop_signals(pid: int) -> bool:
    """Whether process `pid` has its stop handlers in (Linux: SIGUSR1 caught, /proc/PID/status); elsewhere True."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return not sys.platform.startswith("linux")
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGUSR1 - 1) & 1)


class StopForwarder:
    """Forwards a stop signal to the training processes (the direct children of the process `pid`), each once its
    handlers are in (before, the signal's default action would kill it while it imports)."""

    def __init__(self, pid: int):
        self.pid, self.signum, self.sent = pid, None, set()

    def request(self, signum, frame=None) -> None:
        self.signum = self.signum or signum

    def forward(self) -> None:
        import psutil

        if self.signum is None:
            return
        try:
            processes = psutil.Process(self.pid).children()
        except psutil.Error:
            return
        for process in processes:
            if process.pid not in self.sent and _catches_stop_signals(process.pid):
                self.sent.add(process.pid)
                with suppress(psutil.Error):  # ended meanwhile
                    process.send_signal(self.signum)

    def keep_forwarding(self, running=lambda: True) -> None:
        while running():
            self.forward()
            time.sleep(FORWARD_INTERVAL_S)


def run_launcher(arguments: list[str]) -> int:
    """`accelerate launch ARGUMENTS` in a child process (the module docstring); returns the run's exit status."""
    from ..launch.stop_request import STOP_SIGNALS

    child = subprocess.Popen([sys.executable, "-m", __name__, *arguments], start_new_session=True,
                             env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())})
    forwarder = StopForwarder(child.pid)
    previous = {signum: signal.signal(signum, forwarder.request) for signum in STOP_SIGNALS}
    try:
        forwarder.keep_forwarding(lambda: child.poll() is None)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def accelerate_launch(arguments: list[str], **settings) -> int:
    """accelerate's `launch_command` in this process (`settings`: more of its namespace's values); returns the run's
    status (a refusal's 2, said once by the main process; 75 for a run stopped on request), with no traceback."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_command(argparse.Namespace(**{**vars(launch_command_parser().parse_args(arguments)), **settings}))
    except subprocess.CalledProcessError as err:  # one process, which has said why
        return err.returncode
    except ChildFailedError as err:  # several: the main process has said why
        return max(err.get_first_failure()[1].exitcode, 1)
    return 0


def launch_in_this_process(arguments: list[str]) -> int:
    """The child of `run_launcher`: `accelerate_launch`, a stop signal forwarded to the training processes, and
    SIGTERM when `hf-mocose train` dies."""
    from ..launch.stop_request import STOP_SIGNALS, stop_with_parent

    forwarder = StopForwarder(os.getpid())
    for signum in STOP_SIGNALS:
        signal.signal(signum, forwarder.request)
    stop_with_parent()
    if os.environ.get(LAUNCHER_PID_ENV, str(os.getppid())) != str(os.getppid()):
        return 128 + signal.SIGTERM  # `hf-mocose train` died before this process asked to follow it
    # torch elastic's agent leaves SIGTERM and SIGINT to the handlers above (its own stop the workers with SIGTERM,
    # then SIGKILL 30 s later): torch.distributed.run's --signals_to_handle, which accelerate passes on, and the
    # variable older versions read.
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = AGENT_SIGNALS
    threading.Thread(target=forwarder.keep_forwarding, daemon=True).start()
    return accelerate_launch(arguments, signals_to_handle=AGENT_SIGNALS)


def register(subparsers) -> None:
    # "+" prefixes nothing here: everything after `train` (recipe, fields, launch flags) is forwarded as it is.
    train = subparsers.add_parser("train", add_help=False, prefix_chars="+", usage=USAGE[len("usage: "):],
                                  help="train a recipe in the processes accelerate launch starts (--help: options)")
    train.add_argument("argv", nargs=argparse.REMAINDER)
    train.set_defaults(func=lambda args: launch_training(args.argv))


if __name__ == "__main__":  # pragma: no cover (run_launcher's child)
    sys.exit(launch_in_this_process(sys.argv[1:]))
