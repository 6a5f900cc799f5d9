"""Train a MoCoSE (or SimCSE-mode) sentence encoder.

    accelerate launch scripts/train.py training_args/<recipe>.yaml [--field value ...]

A settings mistake prints one line and exits with status 2; HF_MOCOSE_DEBUG=1 shows its traceback.
"""

import sys

from hf_mocose.commands.train import cli_main

if __name__ == "__main__":
    sys.exit(cli_main())
