"""`hf-mocose evaluate` / `diagnose` end to end with tiny encoders, and the encoder wrappers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import SENTEVAL_DIR, needs_senteval

from hf_mocose.commands.cli import main
from hf_mocose.evaluation.sts import STS_YEAR_SETS

WORDS = "a man woman dog cat is playing eating riding guitar horse food the piano ball small big".split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + " ."


@pytest.fixture(scope="module")
def senteval_fixture(tmp_path_factory) -> Path:
    """A small SentEval folder: STS12 (6 pairs a set, one blank gold line), STS-B dev/test and SICK test."""
    root = tmp_path_factory.mktemp("senteval")
    rng = random.Random(0)
    base = root / "STS" / "STS12-en-test"
    base.mkdir(parents=True)
    for name in STS_YEAR_SETS["sts12"][1]:
        pairs = [(sentence(rng), sentence(rng)) for _ in range(6)]
        (base / f"STS.input.{name}.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
        golds = [f"{rng.uniform(0, 5):.2f}" for _ in pairs]
        golds[2] = ""
        (base / f"STS.gs.{name}.txt").write_text("\n".join(golds) + "\n")
    (root / "STS" / "STSBenchmark").mkdir()
    for split in ("dev", "test"):
        rows = [f"g\tf\t2012\t{i}\t{rng.uniform(0, 5):.2f}\t{sentence(rng)}\t{sentence(rng)}" for i in range(12)]
        (root / "STS" / "STSBenchmark" / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    (root / "SICK").mkdir()
    rows = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    rows += [f"{i}\t{sentence(rng)}\t{sentence(rng)}\t{rng.uniform(1, 5):.1f}\tNEUTRAL" for i in range(12)]
    (root / "SICK" / "SICK_test_annotated.txt").write_text("\n".join(rows) + "\n")
    return root


def run_evaluate(model: str, senteval: Path, out: Path, *extra: str) -> dict:
    rc = main(["evaluate", model, "--senteval_dir", str(senteval), "--output", str(out), "--no_progress",
               "--device", "cpu", "--batch_size", "4", *extra])  # fmt: skip
    assert rc == 0
    return json.loads(out.read_text())


def test_evaluate_plain_encoder_json_and_table(tiny_encoder, senteval_fixture, tmp_path, capsys):
    results = run_evaluate(tiny_encoder, senteval_fixture, tmp_path / "r.json", "--pooler", "mean")
    printed = capsys.readouterr()
    assert "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |" in printed.out
    assert "sts13" in printed.err  # skipped tasks are named
    assert results["meta"]["tasks"] == ["sts12", "stsb", "sickr", "stsb_dev"]
    assert results["sts12"]["n"] == 25 and results["stsb"]["n"] == 12 and results["sickr"]["n"] == 12
    for task in ("sts12", "stsb", "sickr", "stsb_dev"):
        assert -100 <= results[task]["spearman"] <= 100 and -100 <= results[task]["pearson"] <= 100
    assert set(results["sts12"]["sets"]) == set(STS_YEAR_SETS["sts12"][1])
    assert results["avg_over"] == ["sts12", "stsb", "sickr"]
    assert results["avg"] == pytest.approx(sum(results[t]["spearman"] for t in results["avg_over"]) / 3)
    assert results["meta"]["encoder"] == {"path": tiny_encoder, "kind": "hf", "pooling": "mean", "max_length": 128}
    assert "sts13" in results["skipped"]
    # deterministic: a second run (other batch size, wmean) gives the same per-set numbers
    again = run_evaluate(tiny_encoder, senteval_fixture, tmp_path / "r2.json", "--pooler", "mean",
                         "--tasks", "sts12", "--aggregation", "wmean", "--batch_size", "7")  # fmt: skip
    assert again["sts12"]["spearman"] == pytest.approx(results["sts12"]["wmean"]["spearman"], abs=1e-4)


def test_mocose_checkpoint_matches_plain_encoder(tiny_encoder, senteval_fixture, tmp_path):
    try:
        from hf_mocose.models.modeling import MoCoSEModel
    except ImportError as err:  # pragma: no cover
        pytest.skip(f"hf_mocose.models.modeling is not importable yet: {err}")
    from transformers import AutoTokenizer

    for pooling in ("cls", "cls_dense"):
        ckpt = tmp_path / f"mocose-{pooling}"
        MoCoSEModel.from_encoder(tiny_encoder, sentence_pooling=pooling).save_pretrained(ckpt)
        AutoTokenizer.from_pretrained(tiny_encoder).save_pretrained(ckpt)
        mocose = run_evaluate(str(ckpt), senteval_fixture, tmp_path / f"m-{pooling}.json", "--tasks", "sts12", "stsb")
        plain = run_evaluate(tiny_encoder, senteval_fixture, tmp_path / f"p-{pooling}.json",
                             "--tasks", "sts12", "stsb", "--pooler", pooling)  # fmt: skip
        assert mocose["meta"]["encoder"]["kind"] == "mocose"
        assert mocose["meta"]["encoder"]["pooling"] == pooling
        for task in ("sts12", "stsb"):
            assert mocose[task]["spearman"] == pytest.approx(plain[task]["spearman"], abs=1e-4)
            assert mocose[task]["pearson"] == pytest.approx(plain[task]["pearson"], abs=1e-4)


def test_transfer_tasks_run_only_when_asked(tiny_encoder, senteval_fixture, tmp_path, capsys):
    import shutil

    root = tmp_path / "senteval"
    shutil.copytree(senteval_fixture, root)
    (root / "TREC").mkdir()
    classes = ["NUM:dist", "LOC:city"]
    for name, n in (("train_5500", 30), ("TREC_10", 8)):
        (root / "TREC" / f"{name}.label").write_text("".join(f"{classes[i % 2]} q{i} is {'big' if i % 2 else 'small'} ?\n"
                                                             for i in range(n)))
    default = run_evaluate(tiny_encoder, root, tmp_path / "d.json", "--pooler", "cls")
    err = capsys.readouterr().err
    assert default["meta"]["tasks"] == ["sts12", "stsb", "sickr", "stsb_dev"] and "trec" not in default
    assert "--tasks transfer" in err and "sts13" in err  # says how to get them, and which STS sets were missing
    asked = run_evaluate(tiny_encoder, root, tmp_path / "t.json", "--pooler", "cls", "--tasks", "transfer")
    assert asked["meta"]["tasks"] == ["trec"] and asked["trec"]["n"] == 8
    assert "mr" in asked["skipped"]  # group members without files are skipped and named


def test_mocose_checkpoint_is_evaluated_on_whole_sentences(tiny_encoder, tmp_path):
    """Not cut at the training max_seq_length (16): pairs that differ after 16 tokens are told apart."""
    from transformers import AutoTokenizer

    from hf_mocose.models.modeling import MoCoSEModel

    ckpt = tmp_path / "ckpt"
    MoCoSEModel.from_encoder(tiny_encoder, max_seq_length=16).save_pretrained(ckpt)
    AutoTokenizer.from_pretrained(tiny_encoder).save_pretrained(ckpt)
    prefix = "the quick brown fox jumps over the lazy dog near the river bank while the sun sets slowly"
    tails = [("a man plays guitar", "a man is playing", 4.8), ("stocks fell", "a cat sleeps", 0.2),
             ("kids run", "children are running", 4.0), ("it rains", "the market opened", 1.1)]
    rows = [f"g\tf\t2012\t{i}\t{score}\t{prefix} {a}\t{prefix} {b}" for i, (a, b, score) in enumerate(tails)]
    (tmp_path / "se" / "STS" / "STSBenchmark").mkdir(parents=True)
    (tmp_path / "se" / "STS" / "STSBenchmark" / "sts-dev.csv").write_text("\n".join(rows) + "\n")
    whole = run_evaluate(str(ckpt), tmp_path / "se", tmp_path / "w.json", "--tasks", "stsb_dev")
    assert whole["meta"]["encoder"]["max_length"] == 128 and whole["stsb_dev"]["spearman"] is not None
    cut = run_evaluate(str(ckpt), tmp_path / "se", tmp_path / "c.json", "--tasks", "stsb_dev", "--max_length", "16")
    assert cut["stsb_dev"]["spearman"] is None  # every pair truncated to the same prefix: no correlation


def test_encode_with_model_restores_mode(tiny_encoder):
    try:
        from hf_mocose.models.modeling import MoCoSEModel
    except ImportError as err:  # pragma: no cover
        pytest.skip(f"hf_mocose.models.modeling is not importable yet: {err}")
    from transformers import AutoTokenizer

    from hf_mocose.models.encoding import encode_with_model

    model = MoCoSEModel.from_encoder(tiny_encoder, sentence_pooling="mean")
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)
    sentences = ["a man is playing guitar .", "a dog .", "the small cat is eating food ."]
    model.train()
    emb = encode_with_model(model, tokenizer, sentences, batch_size=2)
    assert model.training and emb.shape == (3, 32) and emb.dtype == torch.float32 and emb.device.type == "cpu"
    model.eval()
    one_by_one = torch.cat([encode_with_model(model, tokenizer, [s]) for s in sentences])
    assert not model.training
    assert torch.allclose(emb, one_by_one, atol=1e-5)  # padding and sorting do not change embeddings


def test_sentence_transformers_folder(tiny_encoder, senteval_fixture, tmp_path):
    from sentence_transformers import SentenceTransformer, models

    folder = tmp_path / "st"
    transformer = models.Transformer(tiny_encoder)
    SentenceTransformer(modules=[transformer, models.Pooling(32, "mean")], device="cpu").save(str(folder))
    st = run_evaluate(str(folder), senteval_fixture, tmp_path / "st.json", "--tasks", "stsb")
    assert st["meta"]["encoder"]["kind"] == "sentence-transformers"
    plain = run_evaluate(tiny_encoder, senteval_fixture, tmp_path / "p.json", "--tasks", "stsb", "--pooler", "mean")
    assert st["stsb"]["spearman"] == pytest.approx(plain["stsb"]["spearman"], abs=1e-3)
    # a pooler given for a sentence-transformers folder reads it as a plain HF encoder
    forced = run_evaluate(str(folder), senteval_fixture, tmp_path / "f.json", "--tasks", "stsb", "--pooler", "cls")
    assert forced["meta"]["encoder"]["kind"] == "hf"


def test_truncate_dim_scores_the_first_dimensions(tiny_encoder, senteval_fixture, tmp_path, capsys):
    """`--truncate_dim N` scores the first N entries of the same embeddings; N outside 1..width is refused."""
    from hf_mocose.evaluation.runner import load_encoder
    from hf_mocose.evaluation.sts import evaluate_sts_task, load_sts_task

    cut = run_evaluate(tiny_encoder, senteval_fixture, tmp_path / "cut.json", "--pooler", "mean", "--tasks", "stsb",
                       "--truncate_dim", "8")
    assert cut["meta"]["truncate_dim"] == 8 and "(dim 8)" in capsys.readouterr().out
    full = load_encoder(tiny_encoder, "mean", "cpu", show_progress=False)
    expected = evaluate_sts_task(lambda sentences: full.encode(sentences)[:, :8], load_sts_task(senteval_fixture, "stsb"))
    assert cut["stsb"]["spearman"] == pytest.approx(expected["spearman"], abs=1e-4)
    assert cut["stsb"]["spearman"] != pytest.approx(evaluate_sts_task(full.encode, load_sts_task(
        senteval_fixture, "stsb"))["spearman"], abs=1e-3)  # the cut changes the score: it was applied
    for bad in ("0", "33"):
        assert main(["evaluate", tiny_encoder, "--senteval_dir", str(senteval_fixture), "--tasks", "stsb",
                     "--truncate_dim", bad]) == 2
        assert (f"error: --truncate_dim must be a whole number from 1 to the model's 32 dimensions, got {bad}. "
                in capsys.readouterr().err)


def test_cli_errors(tiny_encoder, senteval_fixture, tmp_path, capsys):
    assert main(["evaluate", str(tmp_path), "--senteval_dir", str(senteval_fixture), "--tasks", "stsb"]) == 2
    assert "not a model folder" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "missing"), "--senteval_dir", str(senteval_fixture), "--tasks", "stsb"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["evaluate", tiny_encoder, "--senteval_dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope does not exist" in err and "STS.input.<set>.txt" in err
    assert main(["evaluate", tiny_encoder, "--senteval_dir", str(senteval_fixture), "--tasks", "sts13"]) == 2
    err = capsys.readouterr().err
    assert "STS13-en-test/STS.input.FNWN.txt" in err and "expected the SentEval layout" in err
    assert main(["evaluate", tiny_encoder, "--senteval_dir", str(senteval_fixture), "--tasks", "stsx"]) == 2
    assert "valid task names: sts12" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse rejects an unknown pooler itself
        main(["evaluate", tiny_encoder, "--senteval_dir", str(senteval_fixture), "--pooler", "max"])


def test_diagnose_cli(tiny_encoder, senteval_fixture, tmp_path, capsys):
    plot, out = tmp_path / "spectrum.png", tmp_path / "diag.json"
    rc = main(["diagnose", tiny_encoder, tiny_encoder, "--pooler", "cls", "mean", "--senteval_dir", str(senteval_fixture),
               "--plot", str(plot), "--output", str(out), "--no_progress", "--device", "cpu"])  # fmt: skip
    assert rc == 0
    assert "| Model | Alignment" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["split"] == "test" and len(result["models"]) == 2
    for entry in result["models"].values():
        assert entry["alignment"] >= 0 and entry["uniformity"] <= 0 and len(entry["singular_values"]) == 24
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["diagnose", tiny_encoder, "--pooler", "cls", "mean", "cls", "--senteval_dir", str(senteval_fixture)]) == 2


@pytest.mark.slow
@needs_senteval
def test_minilm_stsb_dev(minilm, tmp_path):
    """Real numbers: all-MiniLM-L6-v2 (its own mean pooling + normalisation) on STS-B dev (1500 pairs)."""
    results = run_evaluate(minilm, SENTEVAL_DIR, tmp_path / "m.json", "--tasks", "stsb_dev", "--batch_size", "64")
    assert results["stsb_dev"]["n"] == 1500
    assert results["stsb_dev"]["spearman"] > 80


def test_ctrl_c_writes_the_finished_tasks_and_names_the_rest(tiny_encoder, senteval_fixture, tmp_path, capsys,
                                                             monkeypatch):
    """A KeyboardInterrupt in the second task: the first is written, one line names the others, exit 130."""
    from hf_mocose.evaluation import runner

    calls = []

    def interrupted_after_one(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return evaluate_sts_task(*args, **kwargs)

    evaluate_sts_task = runner.evaluate_sts_task
    monkeypatch.setattr(runner, "evaluate_sts_task", interrupted_after_one)
    out = tmp_path / "results.json"
    rc = main(["evaluate", tiny_encoder, "--senteval_dir", str(senteval_fixture), "--tasks", "all", "--output",
               str(out), "--no_progress", "--device", "cpu", "--batch_size", "4"])
    err = capsys.readouterr().err
    assert rc == 130 and "Traceback" not in err
    results = json.loads(out.read_text())
    assert "sts12" in results and "stsb" not in results and results["avg_over"] == ["sts12"]
    assert results["interrupted"][0] == "stsb" and "mr" not in results["interrupted"]  # transfer files: none here
    assert err.strip().splitlines()[-1] == (
        f"Interrupted (Ctrl-C): 1 task(s) finished and written to {out}; not run: {' '.join(results['interrupted'])} "
        f"(--tasks {' '.join(results['interrupted'])} runs them).")
