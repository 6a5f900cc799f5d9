"""Shims for the oldest library versions hf-mocose supports, in one place.

setup.cfg's floors are transformers 4.56, sentence-transformers 5.4 and huggingface_hub 0.34 (what pip installs beside
`sentence-transformers[onnx]`: transformers 4.57, sentence-transformers 5.7); `.ci/run` tests them (`.ci/floors.txt`).
Each name here is the library's own where the installed version has it, else the same behaviour written out:

- sentence-transformers < 6: `util.distributed` has no `get_rank`/`get_world_size`, and a stream in one process needs
  `dispatch_batches=False` (`SENTENCE_TRANSFORMERS_5`);
- transformers < 5: no `trainer_utils.sort_checkpoints` nor `trainer_utils.align_special_tokens` (`Trainer` methods),
  `Trainer.set_initial_training_values` also takes the global batch size, callbacks have no `on_push_begin`, and a
  resume trains at the checkpoint's batch size whatever the arguments say (`TRAINER_KEEPS_CHECKPOINT_BATCH_SIZE`);
- huggingface_hub < 1: requests instead of httpx, no `constants.is_offline_mode`, no `RemoteEntryNotFoundError`;
- huggingface_hub < 1.4: no `EvalResultEntry`, the Hub's `.eval_results/` format (None here: no such files).

May import: nothing in hf_mocose (every layer may import it).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist
import huggingface_hub as _hub
from huggingface_hub import constants as _hub_constants
from huggingface_hub import errors as _hub_errors
from sentence_transformers.util import distributed as _st_distributed
import sentence_transformers
import transformers
from transformers import Trainer
from transformers import trainer_utils as _trainer_utils

SENTENCE_TRANSFORMERS_5 = int(sentence_transformers.__version__.split(".")[0]) < 6
all_gather = _st_distributed.all_gather
get_rank = getattr(_st_distributed, "get_rank", lambda: dist.get_rank() if dist.is_initialized() else 0)
get_world_size = getattr(_st_distributed, "get_world_size",
                         lambda: dist.get_world_size() if dist.is_initialized() else 1)


def _sort_checkpoints(output_dir: str) -> list[str]:
    """The `checkpoint-N` folders of `output_dir` (and names that start so), oldest step first."""
    prefix = _trainer_utils.PREFIX_CHECKPOINT_DIR
    steps = [(int(match[1]), str(path)) for path in Path(output_dir).glob(f"{prefix}-*")
             if path.is_dir() and (match := re.match(rf".*{prefix}-([0-9]+)", str(path)))]
    return [path for _, path in sorted(steps)]


sort_checkpoints = getattr(_trainer_utils, "sort_checkpoints", _sort_checkpoints)
align_special_tokens = getattr(_trainer_utils, "align_special_tokens", lambda model, processing_class: (
    Trainer._align_special_tokens(SimpleNamespace(model=model, processing_class=processing_class))))
TRAINER_KEEPS_CHECKPOINT_BATCH_SIZE = int(transformers.__version__.split(".")[0]) < 5


def planned_max_steps(trainer, dataloader) -> int:
    """The optimizer steps `trainer` will run over `dataloader`, as `Trainer.set_initial_training_values` works them
    out (transformers < 5 also wants the global batch size there, which only the sample count it returns uses)."""
    args, values = trainer.args, trainer.set_initial_training_values
    extra = [args.train_batch_size * args.gradient_accumulation_steps * args.world_size
             ] if "total_train_batch_size" in inspect.signature(values).parameters else []
    return values(args, dataloader, *extra)[-1]


def announce_push(trainer) -> None:
    """Runs the callbacks' `on_push_begin`, as `Trainer` does before it pushes (transformers < 5 has no such event)."""
    if hasattr(trainer.callback_handler, "on_push_begin"):
        trainer.callback_handler.on_push_begin(trainer.args, trainer.state, trainer.control)


EvalResultEntry = getattr(_hub, "EvalResultEntry", None)
eval_result_entries_to_yaml = getattr(_hub, "eval_result_entries_to_yaml", None)
RemoteEntryNotFoundError = getattr(_hub_errors, "RemoteEntryNotFoundError", _hub_errors.EntryNotFoundError)
try:  # errors of a request that never got an answer (no network, refused, timed out)
    from huggingface_hub.utils import httpx

    HUB_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (httpx.TransportError,)
except ImportError:  # huggingface_hub < 1
    import requests

    HUB_TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout)


def hub_offline() -> bool:
    """Whether huggingface_hub is in offline mode (HF_HUB_OFFLINE=1)."""
    is_offline = getattr(_hub_constants, "is_offline_mode", None)
    return is_offline() if is_offline is not None else bool(_hub_constants.HF_HUB_OFFLINE)
