"""`MoCoSELoss`'s state in the Trainer's checkpoints: where it goes, writing and reading it.

`SentenceTransformerTrainer` checkpoints the model only; the loss state goes into `checkpoint-N/mocose_loss/`
of the run's folder (`output_dir`, or a hyperparameter-search trial's): `state.pt` (heads, target, queue, last
EMA decay, the model settings, a fingerprint of the model weights) and each process's FGSM "previous" sign
(`fgsm_rank{r}.pt`). A state of another model (encoder type, method, shapes) is refused before it loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

from ..launch.checkpoints import check_same_model, weights_fingerprint as fingerprint
from ..models.configuration import MODEL_CONFIG_FIELDS
from ..models.objective import FGSM_STATE_FILE

LOSS_STATE_DIR = "mocose_loss"
STATE_FILE = "state.pt"


def run_folder(args, state) -> Path | None:
    """Where this run's `checkpoint-N` folders go, or None under a hyperparameter search without `hp_name`
    (the Trainer names those folders from the search backend's trial id, which callbacks are not given)."""
    if not state.is_hyper_param_search:
        return Path(args.output_dir)
    return Path(args.output_dir) / state.trial_name if state.trial_name else None


def checkpoint_folder(args, state) -> Path | None:
    folder = run_folder(args, state)
    return None if folder is None else folder / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"


def locate_checkpoint(args, state) -> Path | None:
    """The `checkpoint-N` folder of this step the Trainer wrote last, in `output_dir` or a trial folder in it."""
    name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
    root = Path(args.output_dir)
    candidates = [folder for folder in (root / name, *root.glob(f"*/{name}")) if folder.is_dir()]
    return max(candidates, key=lambda folder: folder.stat().st_mtime_ns, default=None)


def holds_loss_state(checkpoint: Path, process_index: int, main_process: bool, fgsm_previous: bool) -> bool:
    """Whether `checkpoint` has what this process writes into it."""
    folder = Path(checkpoint) / LOSS_STATE_DIR
    if main_process and not (folder / STATE_FILE).is_file():
        return False
    return not fgsm_previous or (folder / FGSM_STATE_FILE.format(rank=process_index)).is_file()


def save_loss_state(loss: nn.Module, checkpoint: str | Path, process_index: int, main_process: bool) -> None:
    """Writes `checkpoint/mocose_loss/` (the module docstring): `state.pt` if `main_process`, and this
    process's FGSM "previous" sign."""
    folder = Path(checkpoint) / LOSS_STATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if main_process:
        state = {name: module.state_dict() for name, module in loss.state_modules().items()}
        state.update(ema_last_decay=loss.callback.last_decay, fingerprint=fingerprint(loss.online_model),
                     model_fields=_model_fields(loss))
        torch.save(state, folder / STATE_FILE)
    loss.fgsm.save(folder, process_index)


def load_loss_state(loss: nn.Module, checkpoint: str | Path, process_index: int) -> dict[str, Any]:
    """Reads what `save_loss_state` wrote into the loss; returns `{"folder", "fingerprint"}` for the
    check that the model resumed with it is the one it was saved with."""
    folder = Path(checkpoint) / LOSS_STATE_DIR
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"{folder / STATE_FILE} does not exist: {checkpoint} holds no MoCoSELoss state.")
    device = next(loss.online_head.parameters()).device
    state = torch.load(folder / STATE_FILE, map_location=device, weights_only=True)
    # The encoder's own config.json beside the weights; states saved before model_fields compare by shape alone.
    config = Path(checkpoint) / CONFIG_NAME
    saved = dict(state.get("model_fields", {}))
    if config.is_file():
        saved["encoder_config.model_type"] = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    current = _model_fields(loss)
    modules = {name: state[name] for name in state if isinstance(state[name], dict) and name != "model_fields"}
    check_same_model(checkpoint, saved, {k: current.get(k) for k in saved}, _shapes(modules),
                     _shapes({name: module.state_dict() for name, module in loss.state_modules().items()}))
    for name, module in loss.state_modules().items():
        module.load_state_dict(state[name])
    loss.callback.last_decay = state["ema_last_decay"]
    loss.fgsm.load(folder, process_index, device)
    return {"folder": folder, "fingerprint": state["fingerprint"]}


def _model_fields(loss: nn.Module) -> dict[str, Any]:
    config = loss.objective.config
    return {**{name: getattr(config, name) for name in MODEL_CONFIG_FIELDS},
            "encoder_config.model_type": getattr(getattr(loss.online_model.transformers_model, "config", None),
                                                "model_type", None)}


def _shapes(state_dicts: dict[str, dict]) -> dict[str, tuple[int, ...]]:
    return {f"{name}.{key}": tuple(tensor.shape) for name, tensors in state_dicts.items() for key, tensor in tensors.items()}
