"""What the gpu_check trains, made without any download: a randomly initialised BERT built from a config
(`BertConfig()` defaults, i.e. BERT-base; or a tiny one for `--tiny`), a WordPiece tokenizer whose vocabulary is
taken from Python's own documentation (`pydoc_data.topics`, in every CPython), and the software/hardware facts
the report names.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY_VOCAB_SIZE = 1000
# hidden 32, 2 layers: the size tests/conftest.py trains in the test suite
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=128)
PACKAGES = ("torch", "transformers", "sentence-transformers", "accelerate", "datasets", "huggingface-hub",
            "tokenizers", "safetensors", "numpy", "pyarrow", "fsspec", "dill", "multiprocess")


def wordpiece_vocabulary(size: int) -> list[str]:
    """At most `size` WordPiece entries: the special tokens, every character of the Python docs alone and as a
    `##` continuation (so any word of them tokenises, unknown ones piece by piece), then their most frequent
    lower-cased words (ties in alphabetical order: the same list on every machine)."""
    from pydoc_data.topics import topics

    text = " ".join(body for _, body in sorted(topics.items())).lower()
    chars = sorted({c for c in text if not c.isspace()})
    vocab = SPECIAL_TOKENS + chars + [f"##{c}" for c in chars if c.isalnum()]
    known = set(vocab)
    counts = Counter(re.findall(r"[a-z0-9]+", text))
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if w not in known]
    return (vocab + words)[:size]


def build_encoder(folder: Path, tiny: bool, seed: int = 0) -> dict:
    """Writes a randomly initialised `BertModel` and its tokenizer to `folder`; returns facts for the report.

    Full size: `BertConfig()` as it is (BERT-base: 12 layers, hidden 768, vocabulary 30,522 rows, of which the
    tokenizer uses the first few thousand). Tiny: `TINY_BERT` with a 1,000-entry vocabulary.
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    config = BertConfig(vocab_size=TINY_VOCAB_SIZE, **TINY_BERT) if tiny else BertConfig()
    vocab = wordpiece_vocabulary(min(config.vocab_size, TINY_VOCAB_SIZE if tiny else config.vocab_size))
    folder.mkdir(parents=True, exist_ok=True)
    # The vocabulary as a dict: transformers 5 reads `vocab`, and silently ignores the older `vocab_file`.
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)},
                                  model_max_length=config.max_position_embeddings)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(folder)
    return {"model": "random BERT, tiny" if tiny else "random BERT-base (BertConfig() defaults)",
            "layers": config.num_hidden_layers, "hidden": config.hidden_size, "vocab_rows": config.vocab_size,
            "tokenizer_vocab": len(vocab), "parameters": sum(p.numel() for p in model.parameters())}


def quiet_libraries() -> None:
    """Errors only from transformers and datasets, and no progress bars: the report is the output that matters."""
    from datasets.utils.logging import disable_progress_bar
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bar()


def versions() -> dict:
    """Installed versions of the packages the run depends on (None: not installed)."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def device_facts(device: str) -> dict:
    """The accelerator (name, memory, capability, CUDA/cuDNN versions) or the CPU's thread count."""
    import torch

    facts = {"device": device, "cpu_threads": torch.get_num_threads(), "platform": platform.platform()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                     cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                     bf16_supported=torch.cuda.is_bf16_supported())
    return facts


THROUGHPUT_VARIANTS = ("plain", "simcse", "mocose_previous", "st_mnrl")  # throughput.py's; here without torch


def fp32_precision() -> dict:
    """The fp32 precision in force ("ieee": full fp32; "tf32"; "none": torch's default, full fp32 for matrix
    products), everywhere, for CUDA matrix products and for cuDNN convolutions. Read through torch's `fp32_precision`
    API only: once that API has set TF32 (transformers does, for `torch_compile=True` on a GPU), reading the legacy
    TF32 flags raises `RuntimeError: ... mix of the legacy and new APIs`."""
    import torch

    return {"all": torch.backends.fp32_precision, "cuda_matmul": torch.backends.cuda.matmul.fp32_precision,
            "cudnn_conv": torch.backends.cudnn.conv.fp32_precision}


def full_fp32() -> dict:
    """Full fp32 (TF32 off) everywhere, whatever an earlier run chose, through the new API at every level (so that
    none disagrees with another: a process-wide "tf32" under a matmul "ieee" makes `get_float32_matmul_precision`
    raise); returns `fp32_precision()`. What an eager run gets by default: torch's default is full fp32 for matrix
    products, and the Trainer's `tf32` left unset changes nothing."""
    import torch

    torch.backends.fp32_precision = "ieee"
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    return fp32_precision()


class SectionTimeout(BaseException):
    """A section ran past its time (BaseException: no `except Exception` inside a section swallows it)."""


@dataclass
class Sizes:
    """How big each part of the run is: full size on a GPU, or `tiny()` for the CPU."""

    max_seq_length: int = 32
    batch_sizes: tuple[int, ...] = (64, 256)  # (small, main): the main one is the performance goal's
    large_batch: int = 512  # plain and MoCoSE in bf16, when time allows
    warmup_steps: int = 3  # untimed steps of each throughput run (CUDA context, cuBLAS handles, allocator)
    compiled_warmup_steps: int = 3  # compiled rows: MoCoSE "previous" compiles at steps 1 and 2
    timed_steps: int = 10
    queue_size: int = 512  # the throughput runs' K, as scripts/benchmarks/benchmark_train.py
    check_batch: int = 64  # the EMA/queue check, with a queue that wraps around within its steps
    check_steps: int = 6
    check_queue: tuple[int, int] = (200, 37)  # (K, K_s): 6 x 64 keys wrap a 200-slot ring after 163
    equivalence_batch: int = 32  # the reference / FSDP2 / compile runs
    equivalence_steps: int = 3
    equivalence_lr: float = 0.05

    @classmethod
    def tiny(cls) -> "Sizes":
        return cls(warmup_steps=1, timed_steps=3, check_batch=8, check_queue=(20, 3), equivalence_batch=8)


@dataclass
class RunContext:
    """What every section of the gpu_check reads: device, encoder folder, sizes, clock and log."""

    device: str
    tiny: bool
    model_path: str
    workdir: Path
    deadline: float  # time.monotonic() by which everything must be done
    sizes: Sizes
    started: float = field(default_factory=time.monotonic)
    seed: int = 0
    _sentences: dict = field(default_factory=dict, repr=False)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, message: str) -> None:
        print(f"[gpu_check {time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sentences(self, n: int) -> tuple[list[str], bool]:
        """`n` training sentences of >= max_seq_length tokens where there are enough (see `benchmark_sentences`)."""
        from transformers import AutoTokenizer

        from scripts.benchmarks.train_variants import benchmark_sentences

        if n not in self._sentences:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self._sentences[n] = benchmark_sentences(tokenizer, None, n, self.sizes.max_seq_length)
        return self._sentences[n]

    def cfg(self, batch_size: int, steps: int, warmup: int = 0, bf16: bool = False,
            queue_size: int | None = None) -> argparse.Namespace:
        """The settings `train_variants.build_trainer` reads."""
        return argparse.Namespace(batch_size=batch_size, warmup=warmup, steps=steps, bf16=bf16, device=self.device,
                                  max_seq_length=self.sizes.max_seq_length, seed=self.seed,
                                  queue_size=self.sizes.queue_size if queue_size is None else queue_size)

    def trainer(self, variant: str, cfg: argparse.Namespace, sentences: list[str], name: str, **overrides):
        """`train_variants.build_trainer(...)` in `workdir/name`, without the end-of-training metrics print."""
        from transformers import PrinterCallback, set_seed

        from scripts.benchmarks.train_variants import build_trainer

        set_seed(self.seed)
        trainer, ema = build_trainer(variant, cfg, self.model_path, sentences, str(self.workdir / name), **overrides)
        trainer.remove_callback(PrinterCallback)
        return trainer, ema

    def free_memory(self) -> None:
        """Returns what the last run held, so the next one's peak memory is its own."""
        import gc

        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)


def check_result(passed: bool, value, tolerance, measure: str, **detail) -> dict:
    """One check's record: `passed`, the measured `value` against `tolerance` (what both are: `measure`)."""
    return {"passed": bool(passed), "value": value, "tolerance": tolerance, "measure": measure, "detail": detail}


def run_own_session(argv: list[str], timeout: float, what: str, **popen) -> int:
    """Runs `argv` in a session of its own and returns its exit status. Past `timeout` seconds the whole process
    group goes (compile workers, a launcher's children), not only the child, and a `TimeoutError` names `what`."""
    child = subprocess.Popen(argv, start_new_session=True, **popen)
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{what} ran past its {timeout:.0f} s") from None
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
