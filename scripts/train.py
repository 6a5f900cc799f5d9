"""Train a MoCoSE (or SimCSE-mode) sentence encoder.

    accelerate launch scripts/train.py training_args/<recipe>.yaml [--field value ...]
"""

from hf_mocose.training import main

if __name__ == "__main__":
    main()
