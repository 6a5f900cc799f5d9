"""Worker for tests/test_streaming.py: trains on a streamed corpus (an `IterableDataset`) and records, per rank,
the token rows each training forward saw.

    accelerate launch --multi_gpu --num_processes 2 ... tests/stream_worker.py ENCODER OUT_DIR FRONT BATCH STEPS

FRONT: `trainer` (MoCoSETrainer on raw sentences) or `st` (MoCoSELoss with SentenceTransformerTrainer).
Writes OUT_DIR/rank<R>.json: {"rank", "world_size", "steps", "rows": [[token ids without padding], ...]}.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_st_trainer, tiny_training_args  # noqa: E402

N_SENTENCES = 96


def streamed_sentences():
    from datasets import Dataset

    from hf_mocose.data.corpus import python_docs_sentences

    return Dataset.from_dict({"text": python_docs_sentences()[:N_SENTENCES]}).to_iterable_dataset(num_shards=4)


def main():
    encoder, out_dir, front, batch, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    rows = []

    def record(input_ids, attention_mask):
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            rows.append([token for token, keep in zip(ids, mask) if keep])

    if front == "trainer":
        from hf_mocose import MoCoSETrainer

        args = tiny_training_args(out_dir, per_device_train_batch_size=batch, max_steps=steps, fgsm_mode="off",
                                  max_seq_length=32)
        trainer = MoCoSETrainer(model=encoder, args=args, train_dataset=streamed_sentences())
        trainer.model.register_forward_pre_hook(
            lambda module, args, kwargs: record(kwargs["input_ids"], kwargs["attention_mask"]) if module.training
            else None, with_kwargs=True)
    else:
        trainer = make_st_trainer(encoder, out_dir, dataset=streamed_sentences(), per_device_train_batch_size=batch,
                                  max_steps=steps, dataloader_drop_last=True, model_kwargs={"max_seq_length": 32},
                                  accelerator_config={"dispatch_batches": False})
        trainer.loss.register_forward_pre_hook(
            lambda module, args: record(args[0][0]["input_ids"], args[0][0]["attention_mask"]))
    trainer.train()
    rank = trainer.args.process_index
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "world_size": trainer.args.world_size, "steps": trainer.state.global_step,
                   "rows": rows}, handle)


if __name__ == "__main__":
    main()
