"""hf-mocose: momentum-contrastive sentence embeddings (MoCoSE and its family) on the Hugging Face stack.

    from hf_mocose import MoCoSETrainer, MoCoSETrainingArguments   # the Trainer front end
    from hf_mocose import MoCoSELoss                                # the sentence-transformers front end

The trainer and the loss are imported on first use (as TRL and sentence-transformers do), so
`import hf_mocose` does not pay for `transformers.Trainer` or `sentence_transformers`.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from transformers import AutoConfig, AutoModel

from .models.configuration import MoCoSEConfig
from .models.modeling import MoCoSEModel

__version__ = "0.1.0"

AutoConfig.register(MoCoSEConfig.model_type, MoCoSEConfig, exist_ok=True)
AutoModel.register(MoCoSEConfig, MoCoSEModel, exist_ok=True)

# Public name -> the module that defines it, imported when the name is first used.
_LAZY_EXPORTS = {
    "MoCoSELoss": ".st_loss.loss",
    "MoCoSETrainer": ".trainer.mocose_trainer",
    "MoCoSETrainingArguments": ".trainer.training_args",
}

if TYPE_CHECKING:
    from .st_loss.loss import MoCoSELoss
    from .trainer.mocose_trainer import MoCoSETrainer
    from .trainer.training_args import MoCoSETrainingArguments


def __getattr__(name: str):
    if name not in _LAZY_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY_EXPORTS[name], __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_EXPORTS})


__all__ = ["MoCoSEConfig", "MoCoSEModel", *_LAZY_EXPORTS, "__version__"]
