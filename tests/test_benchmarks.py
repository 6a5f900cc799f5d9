"""Smoke tests of scripts/benchmark_train.py and scripts/benchmark_quality.py on a tiny encoder.

They check that the scripts run end to end and write the documented keys, not the figures.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    from hf_mocose.data import python_docs_sentences

    path = tmp_path_factory.mktemp("corpus") / "sentences.txt"
    path.write_text("\n".join(python_docs_sentences()[:200]) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def sts_dev(tmp_path_factory) -> str:
    """A 16-pair file in SentEval's STS-B layout (score in column 5, sentences in 6 and 7)."""
    from hf_mocose.data import python_docs_sentences

    sentences = python_docs_sentences()[200:232]
    rows = [f"genre\tfile\tyear\t{i:04d}\t{(i * 7) % 6:.1f}\t{sentences[2 * i]}\t{sentences[2 * i + 1]}" for i in range(16)]
    path = tmp_path_factory.mktemp("sts") / "sts-dev.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def test_baton_takes_turns_round_robin():
    bench = _load("benchmark_train")
    baton = bench.Baton(["a", "b", "c"])
    log, steps = [], {"a": 3, "b": 1, "c": 2}

    def worker(name):
        for i in range(steps[name]):
            baton.wait(name)
            log.append(name)
            baton.pass_on(name, finished=i == steps[name] - 1)

    threads = [threading.Thread(target=worker, args=(n,)) for n in "abc"]
    for t in threads:
        t.start()
    baton.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert log == ["a", "b", "c", "a", "c", "a"]


def test_training_budget_stops_training():
    quality = _load("benchmark_quality")
    budget = quality.TrainingBudget(0.0)
    control = types.SimpleNamespace(should_training_stop=False)
    state = types.SimpleNamespace(global_step=1, max_steps=10)
    budget.on_train_begin(None, state, control)
    budget.on_step_begin(None, state, control)
    budget.on_step_end(None, state, control)
    assert control.should_training_stop
    assert budget.steps == 1


def test_benchmark_train_smoke(tiny_encoder, corpus, tmp_path):
    bench = _load("benchmark_train")
    out = tmp_path / "train.json"
    summary = bench.main([
        "--model", tiny_encoder, "--corpus", corpus, "--steps", "2", "--warmup", "1", "--batch_size", "4",
        "--max_seq_length", "16", "--queue_size", "16", "--no_memory", "--json", str(out),
    ])
    assert not summary["errors"]
    written = json.loads(out.read_text())
    assert set(written["ms_per_step"]) == set(bench.VARIANTS)
    assert all(v > 0 for v in written["ms_per_step"].values())
    for key in ("mocose_over_plain", "mocose_over_simcse", "mocose_throughput_over_st"):
        assert written[key] > 0
    assert written["steps_timed"]["mocose_previous"] == 2
    assert 0 < written["ema_fraction_of_step"]["mocose_previous"] < 1


@pytest.mark.slow
def test_benchmark_train_memory_probe(tiny_encoder, corpus, tmp_path):
    bench = _load("benchmark_train")
    summary = bench.main([
        "--model", tiny_encoder, "--corpus", corpus, "--steps", "1", "--warmup", "0", "--batch_size", "4",
        "--max_seq_length", "16", "--queue_size", "16", "--variants", "plain", "mocose_previous",
        "--memory_steps", "1",
    ])
    for variant in ("plain", "mocose_previous"):
        assert summary["memory"][variant]["peak_rss_mib"] > 0, summary["memory"]


def test_benchmark_quality_smoke(tiny_encoder, corpus, sts_dev, tmp_path):
    quality = _load("benchmark_quality")
    out = tmp_path / "quality.json"
    summary = quality.main([
        "--model", tiny_encoder, "--corpus", corpus, "--stsb_dev", sts_dev, "--budget_minutes", "0.002",
        "--seeds", "0", "--batch_size", "4", "--max_seq_length", "16", "--queue_size", "16",
        "--max_train_samples", "64", "--output_dir", str(tmp_path / "runs"), "--json", str(out),
    ])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(summary))
    for key in ("before", "mocose", "simcse", "st_mnrl"):
        assert -100 <= written[key] <= 100
    for method in ("mocose", "simcse", "st_mnrl"):
        assert len(written["per_seed"][method]) == 1
        (checkpoint,) = written["checkpoints"][method]
        assert Path(checkpoint).is_dir()
        assert written["details"][method][0]["steps"] >= 1
