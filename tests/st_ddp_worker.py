"""Worker for tests/test_distributed.py: trains a tiny SentenceTransformer with MoCoSELoss and dumps what each rank holds.

Run under `accelerate launch` (2 processes) or plainly (1 process):
    python tests/st_ddp_worker.py ENCODER OUT_DIR PER_DEVICE_BATCH MAX_STEPS ACCUMULATION MAX_GRAD_NORM [RESUME_FROM]
with the environment's MATRYOSHKA_DIMS (a JSON list), if set, as the loss's `matryoshka_dims`, and its
HARD_NEGATIVES (a number n), if set: (anchor, positive, negative_1..n) rows (`conftest.labelled_dataset`).
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from conftest import gradient_recorder, labelled_dataset, make_st_trainer  # noqa: E402


def count_all_reduces():
    """Counts the Python-level all-reduces (DDP's own run in C++ and are not counted)."""
    calls = []
    all_reduce = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting
    return calls


def main():
    encoder, out_dir, batch, steps, accumulation, max_grad_norm = sys.argv[1:7]
    resume = sys.argv[7] if len(sys.argv) > 7 else None
    all_reduces = count_all_reduces()
    negatives = os.environ.get("HARD_NEGATIVES")
    trainer = make_st_trainer(
        encoder, out_dir, n_sentences=128, dataset=None if negatives is None else labelled_dataset(int(negatives), 128), per_device_train_batch_size=int(batch), max_steps=int(steps),
        gradient_accumulation_steps=int(accumulation), max_grad_norm=float(max_grad_norm),
        loss_kwargs=dict(queue_size=100, queue_init_size=4, head_dropout=0.0, target_dropout=False,
                         **({"matryoshka_dims": json.loads(os.environ["MATRYOSHKA_DIMS"])}
                            if "MATRYOSHKA_DIMS" in os.environ else {})),
        model_kwargs=dict(dropout=0.0), save_strategy="steps", save_steps=2, dataloader_drop_last=True,
        # SGD, as in ddp_worker.py: Adam would blow 1- vs 2-process float noise up to lr-sized steps.
        optim="sgd", learning_rate=0.1,
        # Heads and queue drawn differently on each rank: the loss must start every rank from rank 0's.
        init_seed=int(os.environ.get("RANK", "0")),
    )
    loss = trainer.loss
    gradients = gradient_recorder(trainer.model, loss.online_head)
    trainer.add_callback(gradients)
    if resume is not None:  # a checkpoint of another output_dir: hand the loss its state
        loss.load_state(resume)
    trainer.train(resume_from_checkpoint=resume)
    state = {f"model.{k}": v for k, v in trainer.model.state_dict().items()}
    for name in ("online_head", "target_encoder", "target_head", "queue"):
        state.update({f"{name}.{k}": v for k, v in getattr(loss, name).state_dict().items()})
    state = {k: v.detach().cpu() for k, v in state.items()}
    rank = trainer.args.process_index
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    joint_norm = loss.callback.head_gradients.last_grad_norm
    torch.save({"state": state, "losses": losses, "world_size": trainer.args.world_size, "grads": gradients.steps,
                "head_reductions": loss.callback.head_gradients.reductions, "all_reduces": len(all_reduces), "logged_steps": len(losses),
                "joint_norm": None if joint_norm is None else joint_norm.item()},
               os.path.join(out_dir, f"rank{rank}.pt"))
    print(json.dumps({"rank": rank, "world_size": trainer.args.world_size, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
