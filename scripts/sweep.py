"""Run an ablation sweep (a grid of `accelerate launch` training runs) and tabulate STS results.

    python scripts/sweep.py training_args/ablations/table8-queue-slices.yaml --dry_run
    python scripts/sweep.py training_args/ablations/table8-queue-slices.yaml --senteval_dir data/senteval
    python scripts/sweep.py SWEEP.yaml --launcher "accelerate launch --multi_gpu --num_processes 8" -- --max_steps 500

Arguments after `--` go to every training run.
"""

import argparse
import sys

from hf_mocose.commands.sweep import run_sweep


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", help="YAML sweep: base recipe + runs or grid")
    parser.add_argument("--output_root", default="outputs/sweeps", help="runs go to OUTPUT_ROOT/<sweep>/<run>")
    parser.add_argument("--launcher", default="accelerate launch", help="command that starts scripts/train.py")
    parser.add_argument("--senteval_dir", help="evaluate each final checkpoint on the STS tasks found here")
    parser.add_argument("--tasks", nargs="+", help="evaluation tasks (default: every STS task present)")
    parser.add_argument("--dry_run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    print(run_sweep(args.sweep_file, args.output_root, args.launcher, extra, args.dry_run, args.senteval_dir, args.tasks))


if __name__ == "__main__":
    main()
