"""ONNX, int8 ONNX and OpenVINO files beside an export, each checked against its PyTorch embeddings and measured.

    hf-mocose export CHECKPOINT OUTPUT_DIR --onnx [--onnx_arch ARCH] --openvino [--stsb_dev_file sts-dev.csv]

The files hold the Transformer module only (inputs `input_ids`, `attention_mask` and `token_type_ids` where the
tokenizer gives it and the model takes it; output `last_hidden_state`; batch and sequence dynamic), named as
sentence-transformers' ONNX/OpenVINO backends and optimum load them; Pooling and Dense stay the export's modules:
- `onnx/model.onnx`: fp32, `torch.onnx.export(dynamo=True)`, opset 18 (the TorchScript exporter freezes
  transformers 5's attention-mask branches at the example batch and computes others wrong);
- `onnx/model_<qint8|quint8>_<arch>.onnx`: its dynamic int8 quantization (`quantize_onnx`), named as
  sentence-transformers' `export_dynamic_quantized_onnx_model` names it;
- `openvino/openvino_model.xml` + `.bin`: the `openvino` package's conversion of the same graph, fp32.

Each file must reach a cosine of `FP32_MIN_COSINE` (int8: `INT8_MIN_COSINE`, and at most `INT8_MAX_STSB_DROP`
Spearman points below PyTorch on STS-B dev when given) to the PyTorch embedding of every check sentence, else it
is not written and the failure is one logged line. What passed is measured for the card's "Runtimes" table.
"""

from __future__ import annotations

import copy
import logging
import os
import platform
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

ONNX_FILE, OPENVINO_FILE = "onnx/model.onnx", "openvino/openvino_model.xml"
# optimum's AutoQuantizationConfig.<arch>(is_static=False): u8 activations, per-channel symmetric weights, full
# range; the weight type names the file. Where this CPU's arch is not given, `cpu_arch` picks it.
QUANTIZED_WEIGHTS = {"arm64": "qint8", "avx2": "quint8", "avx512": "qint8", "avx512_vnni": "qint8"}
# What an export may write in each runtime folder (a push owns these names there, and nothing else).
RUNTIME_FILES = {"onnx": [ONNX_FILE, *(f"onnx/model_{w}_{a}.onnx" for a, w in QUANTIZED_WEIGHTS.items())],
                 "openvino": [OPENVINO_FILE, OPENVINO_FILE.replace(".xml", ".bin")]}
EXTRAS = {"onnx": ("onnxruntime", "onnxscript", "onnx"), "openvino": ("openvino", "onnxscript", "onnx")}
ONNX_OPSET = 18
FP32_MIN_COSINE, INT8_MIN_COSINE, INT8_MAX_STSB_DROP = 0.9999, 0.98, 1.0
BENCHMARK_SENTENCES, BENCHMARK_BATCH = 256, 32  # the first 256 `python_docs_sentences`, 32 per batch


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
                          stsb_dev_file: str | os.PathLike | None = None) -> None:
    """A one-line error, before anything is exported: a runtime's packages missing (naming the install), an unknown
    `onnx_arch`, a missing `stsb_dev_file`, or either of them given without a runtime."""
    import importlib.util
    if (onnx_arch is not None or stsb_dev_file is not None) and not (onnx or openvino):
        raise ValueError("--onnx_arch and --stsb_dev_file measure the runtime files: add --onnx and/or --openvino.")
    if onnx_arch is not None:
        quantized_onnx_file(onnx_arch)
    if stsb_dev_file is not None and not Path(stsb_dev_file).is_file():
        raise FileNotFoundError(f"STS-B dev file {str(stsb_dev_file)!r} does not exist.")
    for extra in [name for name, wanted in (("onnx", onnx), ("openvino", openvino)) if wanted]:
        if missing := [p for p in EXTRAS[extra] if importlib.util.find_spec(p) is None]:
            raise ValueError(f"--{extra} needs {', '.join(missing)}: pip install 'hf-mocose[{extra}]'.")


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
    """Dynamic int8 of `source` with optimum's `arch` settings, but for the feed-forward down-projections (the
    MatMuls whose weight maps a wider input to a narrower output): their inputs, the GELU outputs, have the widest
    ranges, and all-MiniLM-L6-v2's "hi" fell to cosine 0.976 with them quantized, 0.987 without (docs/publishing.md)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    graph = onnx.load(str(source)).graph
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    down = [node.name for node in graph.node if node.op_type == "MatMul" and any(
        len(shapes.get(name, ())) == 2 and shapes[name][0] > shapes[name][1] for name in node.input)]
    with _quiet():
        quantize_dynamic(source, target, per_channel=True, reduce_range=False, nodes_to_exclude=down,
                         weight_type=QuantType.QUInt8 if QUANTIZED_WEIGHTS[arch] == "quint8" else QuantType.QInt8,
                         extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})


def convert_to_openvino(source: Path, target: Path) -> None:
    """The ONNX graph `source` as an fp32 OpenVINO model at `target`."""
    import openvino as ov
    ov.save_model(ov.convert_model(str(source)), str(target), compress_to_fp16=False)


def runner(path: Path, threads: int):
    """`run(batch of int64 arrays) -> last_hidden_state (B, T, H)` of an ONNX or OpenVINO file, CPU, fp32 maths."""
    if path.suffix == ".xml":
        import openvino as ov
        model = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                          "INFERENCE_PRECISION_HINT": "f32"})  # not bf16 where AMX
        names = [port.get_any_name() for port in model.inputs]
        return lambda batch: model({n: batch[n] for n in names})["last_hidden_state"]
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    return lambda batch: session.run(["last_hidden_state"], {n: batch[n] for n in names})[0]


def encode(st_model, run, sentences: list[str], batch_size: int = BENCHMARK_BATCH) -> np.ndarray:
    """`(N, dim)` sentence embeddings: the export's tokenizer (longest first, as `encode` sorts), `run` in place of its
    Transformer's model, then its own modules after it (Pooling as `1_Pooling/config.json` says, Dense...)."""
    import torch
    transformer, order = st_model[0], np.argsort([-len(s) for s in sentences], kind="stable")
    out = np.empty((len(sentences), st_model.get_embedding_dimension()), dtype=np.float32)
    for start in range(0, len(sentences), batch_size):
        rows = order[start:start + batch_size]
        batch = transformer.tokenizer([sentences[i] for i in rows], padding=True, truncation=True,
                                      max_length=st_model.max_seq_length, return_tensors="np")
        features = {"token_embeddings": torch.from_numpy(np.asarray(run(dict(batch)), dtype=np.float32)),
                    "attention_mask": torch.from_numpy(batch["attention_mask"])}
        with torch.no_grad():
            for module in list(st_model)[1:]:
                features = module(features)
        out[rows] = features["sentence_embedding"].float().numpy()
    return out


def stsb_spearman(embed, pairs) -> float:
    """Spearman x100 of the cosine similarities of `pairs` (`StsPairs`) with their gold scores, rounded to 2 places
    (`metrics.score_correlation`, as every STS score of the library)."""
    from ..metrics import score_correlation
    unique = list(dict.fromkeys([*pairs.sentences1, *pairs.sentences2]))
    vectors = embed(unique).astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)
    index = {sentence: row for row, sentence in enumerate(unique)}
    cosines = [vectors[index[a]] @ vectors[index[b]] for a, b in zip(pairs.sentences1, pairs.sentences2)]
    return round(score_correlation(cosines, pairs.scores)["spearman"], 2)


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


def _measure(st_model, run, row: dict, dev_pairs, sentences: list[str]) -> dict:
    """`row` with this machine's sentences/s on `sentences` (batches of 32) and the STS-B dev Spearman, if given."""
    encode(st_model, run, sentences)  # warm-up: allocations, and the kernels OpenVINO compiles for each new shape
    start = time.perf_counter()
    encode(st_model, run, sentences)
    row["sentences_per_second"] = round(len(sentences) / (time.perf_counter() - start), 1)
    row["stsb_spearman"] = None if dev_pairs is None else stsb_spearman(lambda s: encode(st_model, run, s), dev_pairs)
    return row


def _checked(st_model, run, row: dict, reference: np.ndarray, check_sentences, dev_pairs, sentences, torch_row):
    """Why `row`'s file fails its bounds (one line), else None with `row` measured (see the module)."""
    got = encode(st_model, run, check_sentences)
    cosine = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    bound = INT8_MIN_COSINE if row["precision"] == "int8" else FP32_MIN_COSINE
    row["min_cosine"] = round(float(cosine.min()), 6)
    if row["min_cosine"] < bound:
        return f"cosine {row['min_cosine']:.4f} to the PyTorch embedding of a check sentence (needs >= {bound})"
    _measure(st_model, run, row, dev_pairs, sentences)
    drop = None if dev_pairs is None else torch_row["stsb_spearman"] - row["stsb_spearman"]
    if row["precision"] == "int8" and drop is not None and drop > INT8_MAX_STSB_DROP:
        return (f"STS-B dev Spearman {drop:.2f} below PyTorch's {torch_row['stsb_spearman']:.2f} "
                f"(allowed: {INT8_MAX_STSB_DROP})")
    return None


def export_runtimes(export_dir: str | os.PathLike, check_sentences: list[str], *, onnx: bool = False,
                    openvino: bool = False, onnx_arch: str | None = None,
                    stsb_dev_file: str | os.PathLike | None = None) -> dict:
    """Writes, checks and measures the runtime files of the sentence-transformers folder `export_dir` (see the
    module); returns the card's `runtimes`: `{"cpu", "threads", "batch_size", "sentences", "rows": [{"runtime",
    "file", "backend", "precision", "min_cosine", "stsb_spearman", "sentences_per_second"}, ...], "failures"}`,
    PyTorch's row first; of the runtime files, only those of `rows` stay in `export_dir`."""
    import torch
    from sentence_transformers import SentenceTransformer

    from ..data.corpus import python_docs_sentences
    from ..data.sts_files import read_sts_benchmark
    export_dir, arch = Path(export_dir), onnx_arch or cpu_arch()
    quantized = quantized_onnx_file(arch)
    dev_pairs = None if stsb_dev_file is None else read_sts_benchmark(stsb_dev_file)
    st_model, threads = SentenceTransformer(str(export_dir), device="cpu").eval(), torch.get_num_threads()
    check_sentences, sentences = list(check_sentences), python_docs_sentences()[:BENCHMARK_SENTENCES]
    reference = st_model.encode(check_sentences, batch_size=len(check_sentences), convert_to_numpy=True)
    model = st_model[0].auto_model

    def run_torch(batch):
        with torch.no_grad():
            return model(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state.float().numpy()

    precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(model.dtype, str(model.dtype))
    rows = [_measure(st_model, run_torch, {"runtime": "PyTorch", "file": "model.safetensors", "backend": "torch",
                                           "precision": precision, "min_cosine": 1.0}, dev_pairs, sentences)]
    graph, failures = export_dir / ONNX_FILE, []
    makers = {quantized: lambda: quantize_onnx(graph, export_dir / quantized, arch),
              OPENVINO_FILE: lambda: convert_to_openvino(graph, export_dir / OPENVINO_FILE)}
    wanted = [("ONNX Runtime", ONNX_FILE, "fp32"), ("ONNX Runtime", quantized, "int8")] * onnx + [
        ("OpenVINO", OPENVINO_FILE, "fp32")] * openvino
    try:
        export_onnx(st_model[0], graph)  # the graph every file is made from
    except Exception as err:  # e.g. an architecture torch.export cannot trace: one line, the export stays
        failures.append(f"{ONNX_FILE} (and what is made from it) not written: torch.onnx.export failed: "
                        f"{_one_line(err).rstrip('.')}.")
        wanted = []
    for runtime, file, precision in wanted:
        row = {"runtime": runtime, "file": file, "backend": file.split("/")[0], "precision": precision}
        try:
            makers.get(file, lambda: None)()
            failure = _checked(st_model, runner(export_dir / file, threads), row, reference, check_sentences,
                               dev_pairs, sentences, rows[0])
        except Exception as err:  # a file a runtime cannot load or run
            failure = _one_line(err)
        if failure is None:
            rows.append(row)
        else:
            failures.append(f"{file} not written: {failure.rstrip('.')}.")
    kept = {file for row in rows for file in (row["file"], row["file"].replace(".xml", ".bin"))}
    for file in [file for files in RUNTIME_FILES.values() for file in files if file not in kept]:
        (export_dir / file).unlink(missing_ok=True)  # failed files, and the graph when only OpenVINO was asked for
    for folder in RUNTIME_FILES:
        if (export_dir / folder).is_dir() and not any((export_dir / folder).iterdir()):
            (export_dir / folder).rmdir()
    for line in failures:
        logger.warning(line)
    return {"cpu": cpu_name(), "threads": threads, "batch_size": BENCHMARK_BATCH, "sentences": len(sentences),
            "rows": rows, "failures": failures}
