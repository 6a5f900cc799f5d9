"""hf-mocose: momentum-contrastive sentence embeddings (MoCoSE and its family) on the Hugging Face stack.

    from hf_mocose import MoCoSETrainer, MoCoSETrainingArguments   # the Trainer front end
    from hf_mocose import MoCoSELoss                                # the sentence-transformers front end
    from hf_mocose import export_to_sentence_transformers           # a checkpoint -> a SentenceTransformer folder

Every public name is imported on first use (as TRL and sentence-transformers do), so `import hf_mocose` pays for
neither torch nor transformers. The "mocose" model type is registered with `AutoConfig`/`AutoModel` as soon as
transformers loads them, so `AutoModel.from_pretrained` and `SentenceTransformer` load MoCoSE checkpoints.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from .models.auto_registration import register_mocose_with_auto_classes

__version__ = "0.1.0"

register_mocose_with_auto_classes()

_LAZY_EXPORTS = {
    "MoCoSEConfig": ".models.modeling",  # (defined in .models.configuration; .models.modeling registers both)
    "MoCoSEModel": ".models.modeling", "MoCoSELoss": ".st_loss.loss", "MoCoSETrainer": ".trainer.mocose_trainer",
    "MoCoSETrainingArguments": ".trainer.training_args", "export_to_sentence_transformers": ".publishing.export",
}

if TYPE_CHECKING:
    from .models.configuration import MoCoSEConfig
    from .models.modeling import MoCoSEModel
    from .publishing.export import export_to_sentence_transformers
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


__all__ = [*_LAZY_EXPORTS, "__version__"]
