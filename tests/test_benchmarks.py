"""Smoke tests of scripts/benchmarks/ and scripts/research/ on a tiny encoder.

They check that the scripts run end to end and write the documented keys, not the figures.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/ is a package of the repository root

from scripts.benchmarks import (  # noqa: E402
    benchmark_quality as quality,
    benchmark_runtimes,
    benchmark_train as bench,
    labelled_variants,
    quality_tables,
    train_variants,
    turn_taking,
)
from scripts.research import diagnose_heads, score_interpolations  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    from hf_mocose.data.corpus import python_docs_sentences

    path = tmp_path_factory.mktemp("corpus") / "sentences.txt"
    path.write_text("\n".join(python_docs_sentences()[:200]) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def sts_dev(tmp_path_factory) -> str:
    """A 16-pair file in SentEval's STS-B layout (score in column 5, sentences in 6 and 7)."""
    from hf_mocose.data.corpus import python_docs_sentences

    sentences = python_docs_sentences()[200:232]
    rows = [f"genre\tfile\tyear\t{i:04d}\t{(i * 7) % 6:.1f}\t{sentences[2 * i]}\t{sentences[2 * i + 1]}" for i in range(16)]
    path = tmp_path_factory.mktemp("sts") / "sts-dev.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def test_baton_takes_turns_round_robin():
    baton = turn_taking.Baton(["a", "b", "c"])
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
    budget = quality.TrainingBudget(0.0)
    control = types.SimpleNamespace(should_training_stop=False)
    state = types.SimpleNamespace(global_step=1, max_steps=10)
    budget.on_train_begin(None, state, control)
    budget.on_step_begin(None, state, control)
    budget.on_step_end(None, state, control)
    assert control.should_training_stop
    assert budget.steps == 1


def test_training_budget_scores_at_each_mark_once_off_the_clock():
    """--score_at_minutes: the model is scored once per mark passed, in eval mode, and handed back in train mode."""
    ticks = iter(0.5 * i for i in range(100))
    seen = []

    class Model:
        training = True

        def train(self, mode=True):
            self.training = mode

    model = Model()

    def score(m):
        seen.append(m.training)
        m.training = False  # as encode() leaves it
        return {"stsb_dev": float(len(seen))}

    budget = quality.TrainingBudget(5.0, clock=lambda: next(ticks), marks=(1.0, 2.0, 9.0), score=score)
    control = types.SimpleNamespace(should_training_stop=False)
    state = types.SimpleNamespace(global_step=0, max_steps=10)
    budget.on_train_begin(None, state, control)
    while not control.should_training_stop:
        state.global_step += 1
        budget.on_step_begin(None, state, control)
        budget.on_step_end(None, state, control, model=model)
    assert budget.scores_at == {1.0: {"steps": 1, "scores": {"stsb_dev": 1.0}},
                                2.0: {"steps": 2, "scores": {"stsb_dev": 2.0}}}  # 9.0 is past the budget
    assert state.global_step == 5 and seen == [True, True] and model.training


def test_benchmark_train_smoke(tiny_encoder, corpus, tmp_path):
    out = tmp_path / "train.json"
    summary = bench.main([
        "--model", tiny_encoder, "--corpus", corpus, "--steps", "2", "--warmup", "1", "--batch_size", "4",
        "--max_seq_length", "16", "--queue_size", "16", "--no_memory", "--json", str(out),
        "--markdown", str(tmp_path / "train.md"),
    ])
    assert not summary["errors"]
    written = json.loads(out.read_text())
    assert set(written["ms_per_step"]) == set(bench.VARIANTS) | {f"{v}_bf16" for v in bench.VARIANTS}  # both precisions
    assert all(v > 0 for v in written["ms_per_step"].values())
    for key in ("mocose_over_plain", "mocose_over_floor", "mocose_over_simcse", "mocose_throughput_over_st",
                "mocose_bf16_over_plain_fp32", "mocose_bf16_over_floor_bf16", "plain_bf16_over_plain_fp32"):
        assert written[key] > 0
    assert set(written["bf16_over_fp32"]) == set(bench.VARIANTS)
    assert written["steps_timed"]["mocose_previous"] == written["steps_timed"]["mocose_previous_bf16"] == 2
    assert 0 < written["ema_fraction_of_step"]["mocose_previous_bf16"] < 1
    # every encoder ran the precision its trainer was built for, the no-grad copies included
    assert written["autocast"]["mocose_previous_bf16"] == {"online": ["bfloat16"], "target": ["bfloat16"]}
    assert written["autocast"]["floor_bf16"] == {"online": ["bfloat16"], "target": ["bfloat16"]}
    assert written["autocast"]["floor"] == {"online": ["off"], "target": ["off"]}
    assert "| mocose_previous | " in (tmp_path / "train.md").read_text()  # the fp32 / bf16 side-by-side table


def test_autocast_recorder_names_a_trainer_that_ran_another_precision():
    recorder = train_variants.AutocastRecorder.__new__(train_variants.AutocastRecorder)
    recorder.seen = {"online": {"bfloat16"}, "target": {"off"}}
    assert "'target': ['off']" in recorder.problem("bf16")
    recorder.seen = {"online": {"off"}, "target": {"off"}}
    assert recorder.problem("fp32") is None and recorder.problem("bf16")


@pytest.mark.slow
def test_benchmark_train_memory_probe(tiny_encoder, corpus, tmp_path):
    summary = bench.main([
        "--model", tiny_encoder, "--corpus", corpus, "--steps", "1", "--warmup", "0", "--batch_size", "4",
        "--max_seq_length", "16", "--queue_size", "16", "--variants", "plain", "mocose_previous",
        "--memory_steps", "1",
    ])
    for variant in ("plain", "mocose_previous"):
        assert summary["memory"][variant]["peak_rss_mib"] > 0, summary["memory"]


def _senteval_with_stsb_dev(tmp_path, sts_dev) -> Path:
    """A SentEval folder holding only STS-B dev (the tiny fixture's pairs)."""
    senteval = tmp_path / "senteval"
    (senteval / "STS" / "STSBenchmark").mkdir(parents=True)
    (senteval / "STS" / "STSBenchmark" / "sts-dev.csv").write_text(Path(sts_dev).read_text(encoding="utf-8"))
    return senteval


def test_benchmark_quality_smoke(tiny_encoder, corpus, sts_dev, tmp_path):
    senteval = _senteval_with_stsb_dev(tmp_path, sts_dev)
    out, table = tmp_path / "quality.json", tmp_path / "quality.md"
    variants = ["mocose", "mocose_identity_head_lr", "custom:head_init=identity,fgsm_mode=off", "simcse", "st_mnrl",
                "st_mocose", "st_custom:front_end=st,ema_decay_start=0.9,learning_rate=1e-5", "bf16:bf16=true",
                "st_bf16:front_end=st,bf16=true"]
    summary = quality.main([
        "--model", tiny_encoder, "--corpus", corpus, "--senteval_dir", str(senteval), "--budget_minutes", "0.002",
        "--seeds", "0", "1", "--batch_size", "4", "--max_seq_length", "16", "--queue_size", "16",
        "--max_train_samples", "64", "--output_dir", str(tmp_path / "runs"), "--json", str(out),
        "--markdown", str(table), "--save_models", "--clock", "cpu", "--variants", *variants,
    ])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(summary))
    assert written["tasks"] == ["stsb_dev"]  # only the sets present are scored
    assert -100 <= written["before"]["stsb_dev"] <= 100
    assert list(written["variants"]) == ["mocose", "mocose_identity_head_lr", "custom", "simcse", "st_mnrl", "st_mocose",
                                         "st_custom", "bf16", "st_bf16"]
    assert [run["precision"] for run in written["details"]["bf16"]] == ["bf16", "bf16"]  # its autocast, checked
    assert {run["precision"] for name in ("mocose", "st_mocose") for run in written["details"][name]} == {"fp32"}
    assert written["variants"]["custom"]["overrides"] == {"method": "mocose", "head_init": "identity", "fgsm_mode": "off"}
    for name, entry in written["variants"].items():
        assert len(entry["stsb_dev"]["per_seed"]) == 2 and entry["stsb_dev"]["std"] >= 0
        assert all(steps >= 1 for steps in entry["steps"])
        for run in written["details"][name]:
            assert Path(run["checkpoint"]).is_dir()
    assert "| custom |" in table.read_text()


def test_benchmark_quality_budget_curve_and_merge(tiny_encoder, corpus, sts_dev, tmp_path):
    """--score_at_minutes scores each variant at the marks too; --merge joins one-seed runs into one table."""
    senteval = _senteval_with_stsb_dev(tmp_path, sts_dev)
    common = ["--model", tiny_encoder, "--corpus", corpus, "--senteval_dir", str(senteval), "--budget_minutes", "0.004",
              "--score_at_minutes", "0.00001", "--batch_size", "4", "--max_seq_length", "16", "--queue_size", "16",
              "--max_train_samples", "64", "--output_dir", str(tmp_path / "runs"), "--clock", "cpu",
              "--variants", "mocose", "st_mnrl"]
    for seed in (0, 1):  # one process per seed, as two side-by-side runs would be
        quality.main([*common, "--seeds", str(seed), "--json", str(tmp_path / f"seed{seed}.json")])
    merged = quality.main(["--merge", str(tmp_path / "seed0.json"), str(tmp_path / "seed1.json"),
                           "--json", str(tmp_path / "merged.json")])
    assert merged["seeds"] == [0, 1]
    for name in ("mocose", "st_mnrl"):
        entry = merged["variants"][name]
        per_seed = [json.loads((tmp_path / f"seed{s}.json").read_text())["variants"][name]["stsb_dev"]["mean"]
                    for s in (0, 1)]
        assert entry["stsb_dev"]["per_seed"] == per_seed
        point = entry["at_minutes"]["1e-05"]
        assert point["steps"] == [1, 1]  # the first step passes the mark
        assert -100 <= point["stsb_dev"]["mean"] <= 100
    assert "| mocose | 1e-05 | 1/1 |" in merged["markdown"]
    assert "| mocose | 0.004 |" in merged["markdown"]
    with pytest.raises(SystemExit, match="seeds \\[0, 0\\] repeat"):
        quality.main(["--merge", str(tmp_path / "seed0.json"), str(tmp_path / "seed0.json")])
    other = json.loads((tmp_path / "seed1.json").read_text())
    other["batch_size"] = 8
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="differs from .* in batch_size"):
        quality.main(["--merge", str(tmp_path / "seed0.json"), str(tmp_path / "other.json")])


def test_benchmark_quality_runs_the_field_in_one_command(tiny_encoder, corpus, sts_dev, tmp_path):
    """This library's methods and sentence-transformers' own unsupervised recipes, one command, one table."""
    senteval = _senteval_with_stsb_dev(tmp_path, sts_dev)
    variants = ["mocose", "simcse", "esimcse", "st_mnrl", "st_tsdae", "st_ct", "st_cmnrl"]
    summary = quality.main([
        "--model", tiny_encoder, "--corpus", corpus, "--senteval_dir", str(senteval), "--budget_minutes", "0.002",
        "--seeds", "0", "--batch_size", "4", "--max_seq_length", "16", "--max_train_samples", "64", "--clock", "cpu",
        "--output_dir", str(tmp_path / "runs"), "--markdown", str(tmp_path / "field.md"), "--variants", *variants,
    ])
    assert list(summary["variants"]) == variants
    details = summary["details"]
    assert all(run["steps"] >= 1 for name in variants for run in details[name])
    assert details["st_cmnrl"][0]["sentences"] == 4 * train_variants.CMNRL_BATCH_FACTOR * details["st_cmnrl"][0]["steps"]
    table = (tmp_path / "field.md").read_text()
    assert all(f"| {name} |" in table for name in variants)


def test_benchmark_quality_matryoshka_variants_scored_at_each_width(tiny_encoder, corpus, sts_dev, tmp_path):
    """The Matryoshka variants train (at --matryoshka_dims) and --truncate_dims scores every variant and the
    start at each width, the first d entries of the same embeddings."""
    from sentence_transformers import SentenceTransformer

    from hf_mocose.evaluation.sts import evaluate_sts_task, load_sts_task

    senteval = _senteval_with_stsb_dev(tmp_path, sts_dev)
    variants = ["mocose_matryoshka", "simcse_matryoshka", "st_matryoshka_mnrl", "mocose"]
    summary = quality.main([
        "--model", tiny_encoder, "--corpus", corpus, "--senteval_dir", str(senteval), "--budget_minutes", "0.002",
        "--seeds", "0", "--batch_size", "4", "--max_seq_length", "16", "--max_train_samples", "64", "--clock", "cpu",
        "--queue_size", "16", "--matryoshka_dims", "32", "16", "8", "--truncate_dims", "32", "8", "--save_models",
        "--output_dir", str(tmp_path / "runs"), "--variants", *variants,
    ])
    assert summary["tasks"] == ["stsb_dev@32", "stsb_dev@8"] and set(summary["before"]) == set(summary["tasks"])
    assert summary["variants"]["mocose_matryoshka"]["overrides"]["matryoshka_dims"] == "--matryoshka_dims"
    run = summary["details"]["st_matryoshka_mnrl"][0]
    assert run["steps"] >= 1 and set(run["scores"]) == {"stsb_dev@32", "stsb_dev@8"}
    model = SentenceTransformer(run["checkpoint"], device="cpu")
    encode = quality.encoder_of(model, model.tokenizer, 512)
    dev = load_sts_task(senteval, "stsb_dev")
    for dim in (32, 8):
        expected = evaluate_sts_task(lambda sentences: encode(sentences)[:, :dim], dev)["spearman"]
        assert run["scores"][f"stsb_dev@{dim}"] == pytest.approx(expected, abs=0.01)
    with pytest.raises(SystemExit, match="--truncate_dims 64: the embeddings have 32 dimensions"):
        quality.score_sts(encode, {"stsb_dev": dev}, [64])


def test_tsdae_noise_needs_no_download_and_deletes_at_its_ratio():
    sentences = [" ".join(f"w{i}" for i in range(50))] * 40 + ["one", ""]
    noisy = train_variants.delete_words(sentences, 0.6, seed=0)
    assert noisy == train_variants.delete_words(sentences, 0.6, seed=0)  # seeded
    kept = [len(n.split()) / 50 for n in noisy[:40]]
    assert 0.3 < sum(kept) / len(kept) < 0.5  # about 40 % of the words kept
    assert all(set(n.split()) <= set(sentences[0].split()) for n in noisy[:40])
    assert noisy[40] == "one" and noisy[41] == ""  # at least one word stays; nothing to delete in an empty line


def test_quality_variant_specs():
    # the SimCSE baseline keeps the paper's heads whatever the library defaults are
    assert quality.parse_variant("simcse") == (
        "simcse", {"method": "simcse", "fgsm_mode": "off", "head_init": "random", "head_learning_rate": None})
    assert quality.parse_variant("x:head_learning_rate=1e-3,fgsm_mode=off,predictor_dim=none,queue_size=64") == (
        "x", {"method": "mocose", "head_learning_rate": 1e-3, "fgsm_mode": "off", "predictor_dim": None,
              "queue_size": 64})
    with pytest.raises(SystemExit, match="unknown variant 'nope'"):
        quality.parse_variant("nope")


def test_diagnose_heads_shows_random_heads_lose_the_key_and_identity_heads_keep_it(tiny_encoder, corpus, tmp_path):
    """scripts/research/diagnose_heads.py: the step-0 evidence behind the identity-head default (docs/quality.md)."""
    out = tmp_path / "diag.json"
    results = diagnose_heads.main(["--model", tiny_encoder, "--corpus", corpus, "--n", "16", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    paper, identity = results["paper (random heads)"], results["identity heads"]
    # a tiny random encoder tells sentences apart poorly, so only the contrast is asserted
    assert identity["pos_cos"] - identity["neg_cos"] > paper["pos_cos"] - paper["neg_cos"]
    assert paper["pos_cos"] < identity["pos_cos"] - 0.3
    assert paper["top1"] < identity["top1"]


def test_benchmark_quality_mean_pooling_scores_and_trains_the_token_mean(tiny_encoder, corpus, sts_dev, tmp_path):
    """--pooling mean: the start, MoCoSE and the ST baseline are all trained and scored on the token mean."""
    senteval = _senteval_with_stsb_dev(tmp_path, sts_dev)
    args = ["--model", tiny_encoder, "--corpus", corpus, "--senteval_dir", str(senteval), "--budget_minutes", "0.002",
            "--seeds", "0", "--batch_size", "4", "--max_seq_length", "16", "--queue_size", "16",
            "--max_train_samples", "64", "--clock", "cpu", "--save_models", "--variants", "mocose", "st_mnrl"]
    mean = quality.main([*args, "--pooling", "mean", "--output_dir", str(tmp_path / "mean")])
    cls = quality.main([*args, "--pooling", "cls", "--output_dir", str(tmp_path / "cls")])
    assert mean["pooling"] == "mean" and cls["pooling"] == "cls"
    assert mean["before"]["stsb_dev"] != cls["before"]["stsb_dev"]  # the start is scored with the chosen pooling
    table = quality_tables.markdown_table
    assert "(mean pooling), before training" in table(mean) and "pooling), before" not in table(cls)
    from hf_mocose import MoCoSEModel

    trained = MoCoSEModel.from_pretrained(mean["details"]["mocose"][0]["checkpoint"])
    assert trained.config.sentence_pooling == "mean"


def test_score_interpolations_runs_the_line_from_start_to_trained(tiny_encoder, sts_dev, tmp_path):
    """scripts/research/score_interpolations.py: alpha 1 scores the start, alpha 0 the trained model, both kinds."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.evaluation.sts import load_sts_task

    senteval = _senteval_with_stsb_dev(tmp_path, sts_dev)
    tasks = {"stsb_dev": load_sts_task(str(senteval), "stsb_dev")}
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)

    def score(model):
        return quality.score_sts(quality.encoder_of(model, tokenizer, 64), tasks)["stsb_dev"]

    mocose = MoCoSEModel.from_pretrained(tiny_encoder, method="simcse", sentence_pooling="mean").eval()
    start_score = score(mocose)
    with torch.no_grad():
        for p in mocose.online_encoder.parameters():
            p.add_(0.5 * torch.randn_like(p))
    moved_score = score(mocose)
    mocose.save_pretrained(tmp_path / "mocose")
    tokenizer.save_pretrained(tmp_path / "mocose")
    transformer = Transformer(tiny_encoder, max_seq_length=64)
    st = SentenceTransformer(modules=[transformer, Pooling(transformer.auto_model.config.hidden_size, "mean")],
                             device="cpu")
    st_start = score(st)
    with torch.no_grad():
        for p in st[0].auto_model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    st_moved = score(st)
    st.save(str(tmp_path / "st"))
    assert moved_score != start_score and st_moved != st_start

    result = score_interpolations.main([str(tmp_path / "mocose"), str(tmp_path / "st"), "--alphas", "1", "0", "0.5",
                                  "--start", tiny_encoder, "--senteval_dir", str(senteval), "--tasks", "stsb_dev",
                                  "--eval_max_length", "64", "--json", str(tmp_path / "line.json")])
    got = {(Path(r["model"]).name, r["alpha"]): r["scores"]["stsb_dev"] for r in result["rows"]}
    assert got[("mocose", 1.0)] == pytest.approx(start_score, abs=0.011)
    assert got[("mocose", 0.0)] == pytest.approx(moved_score, abs=0.011)
    assert got[("st", 1.0)] == pytest.approx(st_start, abs=0.011)
    assert got[("st", 0.0)] == pytest.approx(st_moved, abs=0.011)
    assert json.loads((tmp_path / "line.json").read_text())["rows"] == result["rows"]
    a, b = {"w": torch.zeros(2), "step": torch.tensor([3])}, {"w": torch.ones(2), "step": torch.tensor([7])}
    mixed = score_interpolations.interpolate(a, b, 0.25)
    assert torch.equal(mixed["w"], torch.full((2,), 0.25)) and mixed["step"].item() == 3
    with pytest.raises(SystemExit, match=r"--alphas \[1.5\]"):
        score_interpolations.main([str(tmp_path / "st"), "--alphas", "1.5", "--start", tiny_encoder])


def test_benchmark_runtimes_smoke(tiny_encoder, sts_dev, tmp_path):
    """Every path in one run on a tiny sentence-transformers folder: the files written, each row's keys, the goals."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    transformer = Transformer(tiny_encoder, max_seq_length=32)
    SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                        device="cpu").save(str(tmp_path / "st"))
    out, work = tmp_path / "runtimes.json", tmp_path / "files"
    assert benchmark_runtimes.main(["--model", str(tmp_path / "st"), "--stsb_dev_file", sts_dev, "--repeats", "2",
                                    "--work_dir", str(work), "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [row["path"].split(" `")[0] for row in written["rows"]] == [
        "PyTorch", "PyTorch bf16", "ONNX Runtime", "ONNX Runtime", *["OpenVINO"] * 4]
    assert [row["precision"] for row in written["rows"]][2:4] == ["fp32", "int8"]
    assert [row["precision"] for row in written["rows"]][5:] == ["fp32", "int8", "int8"]
    assert written["rows"][0]["speedup"] == 1.0
    for row in written["rows"]:
        assert row["sentences_per_second"] > 0 and row["speedup_spread"][0] <= row["speedup"] <= row["speedup_spread"][1]
        assert row["min_cosine"] >= (0.9999 if row["precision"] == "fp32" else 0) and -100 <= row["stsb_spearman"] <= 100
    assert {p.relative_to(work).as_posix() for p in work.glob("*/*.*")} >= {"onnx/model.onnx",
                                                                            "openvino/openvino_model.xml",
                                                                            "openvino/openvino_model_qint8_quantized.xml"}
    assert len(written["goals"]) == 3 and all(("met (" in g) != ("missed" in g) for g in written["goals"])


def tiny_labelled_senteval(root: Path, rows: int = 192) -> Path:
    """A SentEval folder with the files `hf_mocose.data.labelled.senteval_pairs` reads, `rows` pairs in each training
    set, STS-B dev and SICK trial to score (one scored sentence reused in training, to be dropped)."""
    def words(i: int, kind: str) -> str:
        return f"the {kind} sentence number {i} is about {['cats', 'dogs', 'rain', 'music'][i % 4]}"

    (root / "SICK").mkdir(parents=True)
    (root / "MRPC").mkdir()
    (root / "STS" / "STSBenchmark").mkdir(parents=True)
    (root / "STS" / "STS12-en-test").mkdir()
    judgments = ["ENTAILMENT", "CONTRADICTION", "NEUTRAL"]
    sick = [f"{i}\t{words(i // 3, 'sick')}\t{words(i, 'other')}\t4.0\t{judgments[i % 3]}" for i in range(rows)]
    (root / "SICK" / "SICK_train.txt").write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\t"
                                                  "entailment_judgment\n" + "\n".join(sick) + "\n")
    (root / "SICK" / "SICK_trial.txt").write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tx\n" + "\n".join(
        f"{i}\t{words(i, 'trial')}\t{words(i + 1, 'trial')}\t{1 + i % 4}.0\tNEUTRAL" for i in range(12)) + "\n")
    mrpc = [f"{i % 2}\t{i}\t{i}\t{words(i, 'mrpc')}\t{words(i, 'paraphrase')}" for i in range(rows)]
    (root / "MRPC" / "msr_paraphrase_train.txt").write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                                            + "\n".join(mrpc) + "\n")
    stsb = [f"g\tf\t2012\t{i}\t{i % 6}.0\t{words(i, 'stsb')}\t{words(i, 'similar')}" for i in range(rows)]
    stsb[0] = f"g\tf\t2012\t0\t5.0\t{words(0, 'trial')}\t{words(0, 'similar')}"  # shares a scored sentence: dropped
    (root / "STS" / "STSBenchmark" / "sts-train.csv").write_text("\n".join(stsb) + "\n")
    (root / "STS" / "STSBenchmark" / "sts-dev.csv").write_text("\n".join(
        f"g\tf\t2012\t{i}\t{i % 6}.0\t{words(i, 'dev')}\t{words(i + 2, 'dev')}" for i in range(12)) + "\n")
    return root


def test_benchmark_quality_labelled_variants_measure_quality_and_memory(tiny_encoder, corpus, tmp_path):
    """The labelled-data variants: MoCoSE at batch 16 against MNRL at 16 and 128 and GradCache at 128, one process
    each in the documented protocol (here one call each), merged into one table with the peak training memory."""
    senteval = tiny_labelled_senteval(tmp_path / "senteval")
    common = ["--model", tiny_encoder, "--corpus", corpus, "--senteval_dir", str(senteval), "--budget_minutes", "0.002",
              "--seeds", "0", "--max_seq_length", "16", "--queue_size", "32", "--clock", "cpu", "--pooling", "mean",
              "--output_dir", str(tmp_path / "runs"), "--no-interleave"]
    names = ["labelled_mocose_b16", "labelled_mnrl_b16", "labelled_mnrl_b128", "labelled_cmnrl_b128"]
    for name in names:
        summary = quality.main([*common, "--variants", name, "--json", str(tmp_path / f"{name}.json")])
        assert summary["tasks"] == ["stsb_dev", "sickr_trial"]  # the sets the pairs come from are not scored
        assert summary["labelled_rows"] == 224  # 64 SICK entailments, 96 MRPC paraphrases, 64 STS-B pairs >= 4
    merged = quality.main(["--merge", *(str(tmp_path / f"{name}.json") for name in names)])
    assert list(merged["variants"]) == names
    for name, batch in zip(names, (16, 16, 128, 128)):
        run = merged["details"][name][0]
        assert run["steps"] >= 1 and run["sentences"] == batch * run["steps"]
        assert isinstance(run["peak_train_mib"], float)  # a tiny model in a busy process: near 0, either sign
    assert "peak training MiB" in merged["markdown"]
    memory = labelled_variants.PeakTrainingMemory("cpu")  # the measurement itself: 64 MiB touched while training
    held = bytearray(64 * 2**20)
    held[::4096] = b"x" * (len(held) // 4096)  # every page written, so resident
    memory.on_train_end(None, None, None)
    del held
    assert 60 <= memory.peak_mib <= 80
