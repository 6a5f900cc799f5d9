"""ONNX, int8 ONNX and OpenVINO files beside an export, each checked against its PyTorch embeddings and measured.

    hf-mocose export CHECKPOINT OUTPUT_DIR --onnx [--onnx_arch ARCH] --openvino [--calibration_file FILE]
                     [--stsb_dev_file sts-dev.csv]

The files hold the Transformer module only (inputs `input_ids`, `attention_mask` and `token_type_ids` where the
tokenizer gives it and the model takes it; output `last_hidden_state`; batch and sequence dynamic), named as
sentence-transformers' ONNX/OpenVINO backends and optimum load them; Pooling and Dense stay the export's modules:
- `onnx/model.onnx`: fp32, `torch.onnx.export(dynamo=True)`, opset 18 (the TorchScript exporter freezes
  transformers 5's attention-mask branches at the example batch and computes others wrong), standard operators
  only (ONNX Runtime fuses SkipLayerNormalization and BiasGelu itself when it loads it; see `quantize_onnx`);
- `onnx/model_<qint8|quint8>_<arch>.onnx`: its dynamic int8 quantization (`quantize_onnx`), named as
  sentence-transformers' `export_dynamic_quantized_onnx_model` names it;
- `openvino/openvino_model.xml` + `.bin`: the `openvino` package's conversion of the portable graph, fp32 weights,
  run at OpenVINO's default precision (bf16 on CPUs that compute it, `runner`);
- `openvino/openvino_model_qint8_quantized.xml` + `.bin`: NNCF's static int8 quantization of the portable graph,
  calibrated on `CALIBRATION_SENTENCES` of the run's training sentences (`quantize_openvino`), run with the f32 hint.

Each file, run as its card snippet runs it, must reach `MIN_COSINE[precision]` to the PyTorch embedding of every
check sentence (and, but for fp32, lose at most `MAX_STSB_DROP` Spearman points on STS-B dev when given), else it
is not written and the failure is one logged line. What passed is timed with PyTorch, interleaved
(`runtime_speed.time_runs`), for the card's "Runtimes" table.
"""

from __future__ import annotations

import copy
import ctypes
import gc
import logging
import os
import platform
import statistics
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .runtime_speed import BENCHMARK_BATCH, advised_row, encode, speedups, stsb_spearman, time_runs, torch_runner

logger = logging.getLogger(__name__)

ONNX_FILE = "onnx/model.onnx"
OPENVINO_FILE, OPENVINO_INT8_FILE = "openvino/openvino_model.xml", "openvino/openvino_model_qint8_quantized.xml"
# optimum's AutoQuantizationConfig.<arch>(is_static=False): u8 activations, per-channel symmetric weights, full
# range; the weight type names the file. Where this CPU's arch is not given, `cpu_arch` picks it.
QUANTIZED_WEIGHTS = {"arm64": "qint8", "avx2": "quint8", "avx512": "qint8", "avx512_vnni": "qint8"}
# What an export may write in each runtime folder (a push owns these names there, and nothing else).
RUNTIME_FILES = {"onnx": [ONNX_FILE, *(f"onnx/model_{w}_{a}.onnx" for a, w in QUANTIZED_WEIGHTS.items())],
                 "openvino": [name for xml in (OPENVINO_FILE, OPENVINO_INT8_FILE) for name in (xml, xml[:-4] + ".bin")]}
EXTRAS = {"onnx": ("onnxruntime", "onnxscript", "onnx"), "openvino": ("openvino", "nncf", "onnxscript", "onnx")}
# The precision hint each OpenVINO file runs with, at export and in its card snippets (None: OpenVINO's default). The
# NNCF file at the default bf16 gave wrong embeddings on an AMX CPU (66 of 3,000 STS-B dev sentences, min cosine 0.535).
OPENVINO_HINTS = {OPENVINO_FILE: None, OPENVINO_INT8_FILE: "f32"}
CALIBRATION_SENTENCES = 300
ONNX_OPSET = 18
# The check's bounds by precision; the int8 one is the goal over 3,000 STS-B dev sentences (all-MiniLM-L6-v2
# with every MatMul quantized: "hi" 0.976, docs/publishing.md).
MIN_COSINE, MAX_STSB_DROP = {"fp32": 0.9999, "bf16": 0.995, "int8": 0.97}, 1.0
BENCHMARK_SENTENCES, BENCHMARK_REPEATS = 256, 3  # the first 256 `python_docs_sentences`


def quantized_onnx_file(arch: str) -> str:
    """`onnx/model_<qint8|quint8>_<arch>.onnx`, sentence-transformers' name for `arch`'s dynamic quantization."""
    if arch not in QUANTIZED_WEIGHTS:
        raise ValueError(f"onnx_arch {arch!r} is not one of {', '.join(QUANTIZED_WEIGHTS)}.")
    return f"onnx/model_{QUANTIZED_WEIGHTS[arch]}_{arch}.onnx"


def _cpuinfo(key: str) -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":")[0].strip() == key), None)


def cpu_arch() -> str:
    """This CPU's quantization target: arm64, else avx512_vnni / avx512 / avx2 by its flags."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64"
    flags = set((_cpuinfo("flags") or "").split())
    return "avx512_vnni" if "avx512_vnni" in flags else "avx512" if "avx512f" in flags else "avx2"


def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def check_runtime_request(onnx: bool, openvino: bool, onnx_arch: str | None = None,
                          stsb_dev_file: str | os.PathLike | None = None, calibration_file: str | None = None) -> None:
    """A one-line error, before anything is exported: a runtime's packages missing (naming the install), an unknown
    `onnx_arch`, a missing `stsb_dev_file` or `calibration_file`, or any of them given without its runtime."""
    import importlib.util

    from ..data.corpus import BUILTIN_PYTHON_DOCS
    if (onnx_arch is not None or stsb_dev_file is not None) and not (onnx or openvino):
        raise ValueError("--onnx_arch and --stsb_dev_file measure the runtime files: add --onnx and/or --openvino.")
    if calibration_file is not None and not openvino:
        raise ValueError("--calibration_file calibrates the int8 OpenVINO file: add --openvino.")
    if calibration_file not in (None, BUILTIN_PYTHON_DOCS) and not Path(calibration_file).is_file():
        raise FileNotFoundError(f"Calibration file {str(calibration_file)!r} does not exist.")
    if onnx_arch is not None:
        quantized_onnx_file(onnx_arch)
    if stsb_dev_file is not None and not Path(stsb_dev_file).is_file():
        raise FileNotFoundError(f"STS-B dev file {str(stsb_dev_file)!r} does not exist.")
    for extra in [name for name, wanted in (("onnx", onnx), ("openvino", openvino)) if wanted]:
        if missing := [p for p in EXTRAS[extra] if importlib.util.find_spec(p) is None]:
            raise ValueError(f"--{extra} needs {', '.join(missing)}: pip install 'hf-mocose[{extra}]'.")


class _SignalStack(ctypes.Structure):  # Linux's stack_t
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


@contextmanager
def signal_stack_kept():
    """Puts this thread's alternate signal stack back as it was once what ran inside has freed its OpenVINO models.

    OpenVINO's CPU plugin (2026.4) gives the thread that compiles a model an alternate signal stack of its own and,
    when that model is freed, puts back the stack it found. Two models alive at once and freed in the order they were
    made leave the thread on the freed stack of the first, and the next signal it handles (Ctrl-C, a timeout's
    SIGTERM, an alarm) ends the process with a segmentation fault: found by the test suite, whose next test after an
    export raised SIGALRM. Linux only (the layout of `stack_t`); elsewhere nothing is done."""
    if not sys.platform.startswith("linux"):
        yield
        return
    libc, saved = ctypes.CDLL(None, use_errno=True), _SignalStack()
    libc.sigaltstack(None, ctypes.byref(saved))
    try:
        yield
    except BaseException as err:
        traceback.clear_frames(err.__traceback__)  # the failed frames' models are freed below, not later
        raise
    finally:
        gc.collect()  # models held in reference cycles
        libc.sigaltstack(ctypes.byref(saved), None)


@contextmanager
def _quiet():
    """Mutes the exporters' and the quantizer's advice (torchvision ops, axis renames, pre-processing) while they run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def export_onnx(transformer, path: Path) -> None:
    """The sentence-transformers `Transformer` module's model as fp32 ONNX at `path` (see the module)."""
    import inspect

    import torch
    accepted = inspect.signature(transformer.auto_model.forward).parameters  # DistilBERT takes no token_type_ids
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids")
             if n in transformer.tokenizer.model_input_names and n in accepted]
    example = dict(transformer.tokenizer(["an example", "a longer example sentence"], padding=True, return_tensors="pt"))

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              **({} if token_type_ids is None else {"token_type_ids": token_type_ids})).last_hidden_state

    model = transformer.auto_model
    model = model if model.dtype == torch.float32 else copy.deepcopy(model).float()  # CPU runtimes compute in fp32
    # Bounded below the model's position table: torch 2.6's export must prove its guards over the whole range, and
    # BERT's position-id slice makes a sequence of exactly that length a special case (and an unbounded batch, the
    # int64 maximum). The ONNX graph does not check the bounds (run at the table's length and 1,500 sentences).
    positions = getattr(model.config, "max_position_embeddings", 512)
    dims = {0: torch.export.Dim("batch_size", max=2**16), 1: torch.export.Dim("sequence_length", max=positions - 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet():
        torch.onnx.export(LastHiddenState(model).eval(), (), str(path),
                          kwargs={n: example[n] for n in names}, dynamo=True, opset_version=ONNX_OPSET,
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_shapes={n: dims for n in names}, external_data=False, verbose=False,
                          optimize=True)  # the default on torch 2.13; 2.6 left the weights' Transpose unfolded
    _name_dynamic_axes(path, [dim.__name__ for dim in dims.values()])


def _name_dynamic_axes(path: Path, axis_names: list[str]) -> None:
    """Gives the inputs' dynamic axes optimum's names (`batch_size`, `sequence_length`) throughout the graph where
    the exporter left its own symbols (torch 2.6 writes `s0`, `s1`; newer versions take the `Dim` names)."""
    import onnx
    model = onnx.load(str(path))
    graph = model.graph
    rename = {dim.dim_param: name for tensor in graph.input
              for dim, name in zip(tensor.type.tensor_type.shape.dim, axis_names) if dim.dim_param not in ("", name)}
    if rename:
        for tensor in [*graph.input, *graph.output, *graph.value_info]:
            for dim in tensor.type.tensor_type.shape.dim:
                if dim.dim_param in rename:  # (setting dim_param at all would clear a fixed dim_value)
                    dim.dim_param = rename[dim.dim_param]
        onnx.save(model, str(path))


def quantize_onnx(source: Path, target: Path, arch: str) -> None:
    """Dynamic int8 of `source` with optimum's `arch` settings (per-channel symmetric weights, u8 activations):
    every MatMul and the embeddings' Gather. Keeping the feed-forward down-projections in fp32 cost all-MiniLM-L6-v2
    a third of the int8 speed for 0.01 of min cosine; quantizing the graph ONNX Runtime's transformer optimizer
    fused (optimum's O2) measured slower than quantizing this one, which the runtime fuses at load
    (docs/publishing.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    with _quiet():
        quantize_dynamic(source, target, per_channel=True, reduce_range=False,
                         weight_type=QuantType.QUInt8 if QUANTIZED_WEIGHTS[arch] == "quint8" else QuantType.QInt8,
                         extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})


def convert_to_openvino(source: Path, target: Path) -> None:
    """The ONNX graph `source` as an OpenVINO model with fp32 weights at `target`."""
    import openvino as ov
    ov.save_model(ov.convert_model(str(source)), str(target), compress_to_fp16=False)


def quantize_openvino(source: Path, target: Path, tokenizer, sentences: list[str], max_length: int) -> None:
    """Static int8 of the ONNX graph `source` as an OpenVINO model at `target`: NNCF's post-training quantization for
    transformers (SmoothQuant, fast bias correction), calibrated on `sentences` one at a time (their own lengths)."""
    import nncf
    import openvino as ov
    model = ov.Core().read_model(str(source))
    names = [port.get_any_name() for port in model.inputs]
    batches = [tokenizer([s], truncation=True, max_length=max_length, return_tensors="np") for s in sentences]
    with _quiet():
        quantized = nncf.quantize(model, nncf.Dataset(batches, lambda batch: {n: batch[n] for n in names}),
                                  model_type=nncf.ModelType.TRANSFORMER, subset_size=len(batches))
    ov.save_model(quantized, str(target), compress_to_fp16=False)


def runner(path: Path, threads: int, openvino_hint: str | None = None):
    """`(run, precision)`: `run(batch of int64 arrays) -> last_hidden_state (B, T, H)` of an ONNX or OpenVINO file on
    the CPU, as the card's snippets run it (OpenVINO at its default precision, bf16 where the CPU computes it, unless
    `openvino_hint` names another), and the precision it computes in ("fp32", "bf16"; int8 files by their name)."""
    int8 = "_qint8_" in path.name or "_quint8_" in path.name
    if path.suffix == ".xml":
        import openvino as ov
        hint = {} if openvino_hint is None else {"INFERENCE_PRECISION_HINT": openvino_hint}
        model = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads, **hint})
        names = [port.get_any_name() for port in model.inputs]
        hint = model.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "f32", "bf16" or "f16"
        return (lambda batch: model({n: batch[n] for n in names})["last_hidden_state"]), \
            "int8" if int8 else {"f32": "fp32"}.get(hint, hint)
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    return (lambda batch: session.run(["last_hidden_state"], {n: batch[n] for n in names})[0]), \
        "int8" if int8 else "fp32"


def computes_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX-512 BF16 or AMX on x86, BF16 on arm64), where PyTorch and
    OpenVINO run bf16 natively rather than emulated."""
    flags = set(((_cpuinfo("flags") or "") + " " + (_cpuinfo("Features") or "")).split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


# Why a row can be slower than PyTorch fp32 (the card says it where one is): by file, else by precision.
SLOWER_BECAUSE = {ONNX_FILE: "the portable graph, unfused: for runtimes other than ONNX Runtime",
                  "fp32": "fp32 as PyTorch, in this runtime's fp32 kernels",
                  "bf16": "bf16's casts around every kernel cost more than they save at this model's size",
                  "int8": "dynamic int8: each batch's activations are quantized at run time"}


def _checked(st_model, run, row: dict, reference: np.ndarray, check_sentences, dev_pairs, torch_row) -> str | None:
    """Why `row`'s file fails its bounds (one line), else None with its min cosine and STS-B dev Spearman set."""
    got = encode(st_model, run, check_sentences)
    cosine = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    bound = MIN_COSINE.get(row["precision"], MIN_COSINE["bf16"])
    row["min_cosine"] = round(float(cosine.min()), 6)
    if row["min_cosine"] < bound:
        return f"cosine {row['min_cosine']:.4f} to the PyTorch embedding of a check sentence (needs >= {bound})"
    row["stsb_spearman"] = None if dev_pairs is None else stsb_spearman(lambda s: encode(st_model, run, s), dev_pairs)
    drop = None if dev_pairs is None else torch_row["stsb_spearman"] - row["stsb_spearman"]
    if row["precision"] != "fp32" and drop is not None and drop > MAX_STSB_DROP:
        return (f"STS-B dev Spearman {drop:.2f} below PyTorch's {torch_row['stsb_spearman']:.2f} "
                f"(allowed: {MAX_STSB_DROP})")
    return None


@signal_stack_kept()
def export_runtimes(export_dir: str | os.PathLike, check_sentences: list[str], *, onnx: bool = False,
                    openvino: bool = False, onnx_arch: str | None = None,
                    stsb_dev_file: str | os.PathLike | None = None, calibration_file: str | None = None) -> dict:
    """Writes, checks and measures the runtime files of the sentence-transformers folder `export_dir` (see the
    module); returns the card's `runtimes`: `{"cpu", "threads", "batch_size", "sentences", "repeats", "rows":
    [{"runtime", "file", "backend", "precision", "openvino_hint", "min_cosine", "stsb_spearman",
    "sentences_per_second", "speedup", "slower_because"}, ...], "advised", "calibration", "failures"}`: PyTorch's row
    first, then PyTorch in bf16 where the CPU computes it (`computes_bf16`), then the files; `speedup` is the median
    over the repeats of the row's speed over PyTorch's in the same repeat, `advised` the index of `advised_row`. The
    NNCF file calibrates on `calibration_file` (`load_sentences`' formats; default the Python-docs corpus). Of the
    runtime files, only those of `rows` stay."""
    import torch
    from sentence_transformers import SentenceTransformer

    from ..data.corpus import BUILTIN_PYTHON_DOCS, load_sentences, python_docs_sentences
    from ..data.sts_files import read_sts_benchmark
    from .card_facts import public_name
    export_dir, arch, calibration_file = Path(export_dir), onnx_arch or cpu_arch(), calibration_file or BUILTIN_PYTHON_DOCS
    quantized = quantized_onnx_file(arch)
    dev_pairs = None if stsb_dev_file is None else read_sts_benchmark(stsb_dev_file)
    st_model, threads = SentenceTransformer(str(export_dir), device="cpu").eval(), torch.get_num_threads()
    check_sentences, sentences = list(check_sentences), python_docs_sentences()[:BENCHMARK_SENTENCES]
    reference = st_model.encode(check_sentences, batch_size=len(check_sentences), convert_to_numpy=True)
    model = st_model[0].auto_model
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(model.dtype, str(model.dtype))
    torch_row = {"runtime": "PyTorch", "file": "model.safetensors", "backend": "torch", "precision": precision,
                 "min_cosine": 1.0}
    rows, runs, failures = [torch_row], [torch_runner(model)], []
    torch_row["stsb_spearman"] = None if dev_pairs is None else stsb_spearman(
        lambda s: encode(st_model, runs[0], s), dev_pairs)
    graph = export_dir / ONNX_FILE
    makers = {quantized: lambda: quantize_onnx(graph, export_dir / quantized, arch),
              OPENVINO_FILE: lambda: convert_to_openvino(graph, export_dir / OPENVINO_FILE),
              OPENVINO_INT8_FILE: lambda: quantize_openvino(
                  graph, export_dir / OPENVINO_INT8_FILE, st_model.tokenizer,
                  load_sentences(calibration_file, max_train_samples=CALIBRATION_SENTENCES)["text"],
                  st_model.max_seq_length)}
    wanted = [("ONNX Runtime", ONNX_FILE), ("ONNX Runtime", quantized)] * onnx + [
        ("OpenVINO", OPENVINO_FILE), ("OpenVINO", OPENVINO_INT8_FILE)] * openvino
    if precision == "fp32" and computes_bf16():
        wanted.insert(0, ("PyTorch", "model.safetensors"))
        makers["model.safetensors"] = lambda: (torch_runner(copy.deepcopy(model).to(torch.bfloat16)), "bf16")
    try:
        export_onnx(st_model[0], graph)  # the graph every file is made from
    except Exception as err:  # e.g. an architecture torch.export cannot trace: one line, the export stays
        failures.append(f"{ONNX_FILE} (and what is made from it) not written: torch.onnx.export failed: "
                        f"{_one_line(err).rstrip('.')}.")
        wanted = wanted[:1] if wanted and wanted[0][0] == "PyTorch" else []
    for runtime, file in wanted:
        row = {"runtime": runtime, "file": file, "backend": "torch" if runtime == "PyTorch" else file.split("/")[0]}
        try:
            made = makers.get(file, lambda: None)()
            run, row["precision"] = made if runtime == "PyTorch" else runner(export_dir / file, threads,
                                                                              OPENVINO_HINTS.get(file))
            row["openvino_hint"] = OPENVINO_HINTS.get(file)
            failure = _checked(st_model, run, row, reference, check_sentences, dev_pairs, torch_row)
        except Exception as err:  # a file a runtime cannot load or run
            failure = _one_line(err)
        if failure is None:
            rows.append(row)
            runs.append(run)
        else:
            failures.append(f"{'PyTorch bf16' if runtime == 'PyTorch' else file} not written: {failure.rstrip('.')}.")
    for row, times, ratios in zip(rows, seconds := time_runs(st_model, runs, sentences), speedups(seconds)):
        row["sentences_per_second"] = round(len(sentences) / statistics.median(times), 1)
        row["speedup"] = round(statistics.median(ratios), 2)
        row["slower_because"] = None if row["speedup"] >= 1 else SLOWER_BECAUSE.get(
            row["file"], SLOWER_BECAUSE.get(row["precision"]))
    kept = {file for row in rows for file in (row["file"], row["file"].replace(".xml", ".bin"))}
    for file in [file for files in RUNTIME_FILES.values() for file in files if file not in kept]:
        (export_dir / file).unlink(missing_ok=True)  # failed files, and the graph when only OpenVINO was asked for
    for folder in RUNTIME_FILES:
        if (export_dir / folder).is_dir() and not any((export_dir / folder).iterdir()):
            (export_dir / folder).rmdir()
    for line in failures:
        logger.warning(line)
    return {"cpu": cpu_name(), "threads": threads, "batch_size": BENCHMARK_BATCH, "sentences": len(sentences),
            "repeats": BENCHMARK_REPEATS, "rows": rows, "advised": advised_row(rows),
            "calibration": public_name(calibration_file), "failures": failures}
