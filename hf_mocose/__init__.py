"""hf-mocose: momentum-contrastive sentence embeddings (MoCoSE and its family) on the Hugging Face stack."""

from transformers import AutoConfig, AutoModel

from .configuration import MoCoSEConfig
from .modeling import MoCoSEModel

__version__ = "0.1.0"

AutoConfig.register(MoCoSEConfig.model_type, MoCoSEConfig, exist_ok=True)
AutoModel.register(MoCoSEConfig, MoCoSEModel, exist_ok=True)

__all__ = ["MoCoSEConfig", "MoCoSEModel", "__version__"]
