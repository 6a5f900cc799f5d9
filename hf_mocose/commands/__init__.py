"""The command line: the `hf-mocose` entry point, `scripts/train.py`'s driver, sweeps, and how a command fails.

- `cli`: `hf-mocose` (its sub-commands registered by the modules that own them, imported only when the parser is
  built), and how every entry point fails: a settings mistake as one line and exit status 2, a bug with a traceback.
- `train`: the training entry point behind `accelerate launch scripts/train.py training_args/<recipe>.yaml`.
- `launch`: `hf-mocose train RECIPE`, which starts `train` in the processes `accelerate launch` starts (TRL's way).
- `recipes`: recipes and launcher configs by name, from the checkout or the wheel; `hf-mocose recipes`.
- `sweep`: ablation sweeps (a YAML grid -> `accelerate launch` runs -> one table), behind `scripts/sweep.py`.

May import: anything in `hf_mocose`; nothing in `hf_mocose` imports it (the top of the dependency graph).
"""
