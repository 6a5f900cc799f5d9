"""What the loss's callback and checkpoint code read from a `MoCoSELoss`, as a `Protocol`.

`callback` and `checkpoint` work on the loss that owns them, and `loss` builds both: naming the loss
class in their signatures would make the three modules import one another. They name this protocol
instead, and `MoCoSELoss` satisfies it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from torch import nn

from ..methods.augmentation import FGSMPerturbation
from ..models.queue import KeyQueue


class MoCoSELossParts(Protocol):
    """The parts of a `MoCoSELoss` its callback saves, restores and drives (see `hf_mocose.st_loss.loss`)."""

    online_head: nn.Sequential  # pooler + projection + predictor, trained with the model
    target_encoder: nn.Module  # the EMA copy of the SentenceTransformer
    target_head: nn.Sequential  # the EMA copy of the pooler + projection
    queue: KeyQueue
    fgsm: FGSMPerturbation
    settings: dict[str, Any]  # the loss's arguments, as `get_config_dict` reports them
    callback: Any  # its `MoCoSELossCallback`
    _ready: bool  # set at on_train_begin: the loss refuses to run before its callback has
    _restored: dict[str, Any] | None  # what `load_state` read, checked at on_train_begin

    @property
    def online_model(self) -> nn.Module: ...

    def move_to_model_device(self) -> None: ...

    def load_state(self, checkpoint: str | Path) -> None: ...
