"""Worker for tests/test_distributed.py: trains a tiny MoCoSE model and dumps what each rank holds.

Run under `accelerate launch` (2 processes) or plainly (1 process):
    python tests/ddp_worker.py ENCODER OUT_DIR PER_DEVICE_BATCH MAX_STEPS [RESUME_FROM|-] [METHOD] [OPTIONS_JSON]

OPTIONS_JSON: more `make_trainer` keyword arguments (training arguments, `fraternal_encoder`),
`"reversed_una": true` for UNA hard negatives that are each sentence's words in reverse order: a
deterministic stand-in for UNA's draws, which depend on each rank's own batch, and
`"slow_rank1_rng_save": SECONDS`: rank 1 writes its RNG state that much later; each rank's result then lists the
`rng_state*.pth` files present when trainer_state.json was written into each checkpoint.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_trainer  # noqa: E402


class ReversedWords:
    """Makes each sentence's "hard negative" by reversing its words (no randomness)."""

    def augment(self, sentences, rng=None):
        return [" ".join(reversed(sentence.split())) for sentence in sentences]


def watch_checkpoint_marking(rank1_delay: float) -> list[list[str]]:
    """Delays rank 1's `Trainer._save_rng_state` by `rank1_delay` s; the list returned fills with the RNG state
    files each checkpoint held when its trainer_state.json was written."""
    seen = []
    if rank1_delay:
        save_rng_state, save_to_json = transformers.Trainer._save_rng_state, transformers.TrainerState.save_to_json

        def slow_save_rng_state(self, output_dir):
            if self.args.process_index == 1:
                time.sleep(rank1_delay)
            save_rng_state(self, output_dir)

        def noting_save_to_json(self, json_path):
            if Path(json_path).parent.name.startswith("checkpoint-"):
                seen.append(sorted(path.name for path in Path(json_path).parent.glob("rng_state*.pth")))
            save_to_json(self, json_path)

        transformers.Trainer._save_rng_state = slow_save_rng_state
        transformers.TrainerState.save_to_json = noting_save_to_json
    return seen


def main():
    encoder, out_dir, batch, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    resume = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    method = sys.argv[6] if len(sys.argv) > 6 else "mocose"
    options = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
    reversed_una = options.pop("reversed_una", False)
    if reversed_una:
        options.update(hard_negatives="una", una_window=0.5, keep_text=True)
    settings = dict(
        n_sentences=128, per_device_train_batch_size=batch, max_steps=steps,
        encoder_dropout=0.0, head_dropout=0.0, fgsm_mode="off", pad_to_max_length=True,
        queue_size=40, queue_init_size=4, save_strategy="steps", save_steps=2,
        # SGD: Adam would blow float noise in gradients that are ~0 in theory (attention key biases) up to
        # lr-sized steps, and 1- vs 2-process sums differ in the last bits.
        optim="sgd", learning_rate=0.1, method=method,
    )
    rng_files_when_marked = watch_checkpoint_marking(options.pop("slow_rank1_rng_save", 0))
    trainer = make_trainer(encoder, out_dir, **{**settings, **options})
    if reversed_una:
        trainer.data_collator.una_augmenter = ReversedWords()
    trainer.train(resume_from_checkpoint=resume)
    rank = trainer.args.process_index
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    state = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    torch.save({"state": state, "losses": losses, "world_size": trainer.args.world_size,
                "rng_files_when_marked": rng_files_when_marked}, os.path.join(out_dir, f"rank{rank}.pt"))
    print(json.dumps({"rank": rank, "world_size": trainer.args.world_size, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
