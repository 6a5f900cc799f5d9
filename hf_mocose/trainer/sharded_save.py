"""`MoCoSETrainer.save_model` under FSDP's `SHARDED_STATE_DICT`, which writes no weights file by itself.

A checkpoint folder gets the config and tokenizer beside accelerate's DCP folder, and any other folder
(the final model, what export and push read) gets the full weights, as with `FULL_STATE_DICT`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..publishing.model_card import save_card_facts


def uses_sharded_state_dict(trainer) -> bool:
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None) if trainer.is_fsdp_enabled else None
    return plugin is not None and "SHARDED_STATE_DICT" in str(plugin.state_dict_type)


def complete_sharded_save(trainer, output_dir: str) -> None:
    """After `Trainer.save_model(output_dir)` under FSDP with `SHARDED_STATE_DICT`, which writes nothing:

    - the checkpoint `_save_checkpoint` is writing (`checkpoint-<global_step>`): config.json, the tokenizer,
      training_args.bin and card_facts.json (the card's) beside the DCP folder, so the
      checkpoint is recognised and checked on resume;
    - any other folder (the final model): the full weights, gathered from all ranks, as `FULL_STATE_DICT`
      saves them, so export and push read a plain `save_pretrained` folder.
    Runs on every process (the gather is collective). A no-op for other set-ups.
    """
    if not uses_sharded_state_dict(trainer):
        return
    if Path(output_dir).name == f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}":
        if trainer.args.should_save:
            from transformers.trainer import TRAINING_ARGS_NAME

            os.makedirs(output_dir, exist_ok=True)
            trainer.accelerator.unwrap_model(trainer.model).config.save_pretrained(output_dir)
            if trainer.processing_class is not None:
                trainer.processing_class.save_pretrained(output_dir)
            torch.save(trainer.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
            save_card_facts(output_dir, trainer)
        return
    trainer._save(output_dir, state_dict=trainer.accelerator.get_state_dict(trainer.model))
