"""Worker for tests/test_distributed.py: trains a tiny SentenceTransformer with MoCoSELoss and dumps what each rank holds.

Run under `accelerate launch` (2 processes) or plainly (1 process):
    python tests/st_ddp_worker.py ENCODER OUT_DIR PER_DEVICE_BATCH MAX_STEPS [RESUME_FROM]
"""

import json
import os
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_st_trainer  # noqa: E402


class HeadGradients(TrainerCallback):
    """Keeps the online heads' gradients as the optimizer is about to apply them."""

    def __init__(self, heads):
        self.heads, self.steps = heads, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.steps.append({k: p.grad.detach().clone() for k, p in self.heads.named_parameters()})


def main():
    encoder, out_dir, batch, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    resume = sys.argv[5] if len(sys.argv) > 5 else None
    trainer = make_st_trainer(
        encoder, out_dir, n_sentences=128, per_device_train_batch_size=batch, max_steps=steps,
        loss_kwargs=dict(queue_size=40, queue_init_size=4, head_dropout=0.0, target_dropout=False),
        model_kwargs=dict(dropout=0.0), save_strategy="steps", save_steps=2, dataloader_drop_last=True,
        # SGD, as in ddp_worker.py: Adam would blow 1- vs 2-process float noise up to lr-sized steps.
        optim="sgd", learning_rate=0.1,
        # Heads and queue drawn differently on each rank: the loss must start every rank from rank 0's.
        init_seed=int(os.environ.get("RANK", "0")),
    )
    head_gradients = HeadGradients(trainer.loss.online_head)
    trainer.add_callback(head_gradients)
    if resume is not None:  # a checkpoint of another output_dir: hand the loss its state
        trainer.loss.load_state(resume)
    trainer.train(resume_from_checkpoint=resume)
    loss = trainer.loss
    state = {f"model.{k}": v for k, v in trainer.model.state_dict().items()}
    for name in ("online_head", "target_encoder", "target_head", "queue"):
        state.update({f"{name}.{k}": v for k, v in getattr(loss, name).state_dict().items()})
    state = {k: v.detach().cpu() for k, v in state.items()}
    rank = trainer.args.process_index
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    torch.save({"state": state, "losses": losses, "world_size": trainer.args.world_size, "head_grads": head_gradients.steps},
               os.path.join(out_dir, f"rank{rank}.pt"))
    print(json.dumps({"rank": rank, "world_size": trainer.args.world_size, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
