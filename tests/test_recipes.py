"""Each ablation grid carries the MoCoSE paper's values for its table, and the recipes their seeds' settings.

The expected values are written out here from the paper's tables (Cao et al., Findings of ACL 2022), not
read from the grids: a grid that drifts from its table fails. Anything not in the paper lives in a
`*-extra.yaml` grid that says so.
"""

import inspect
import sys
from pathlib import Path

import pytest

from hf_mocose.commands.sweep import load_sweep
from hf_mocose.commands.train import parse_args
from hf_mocose.trainer.training_args import MoCoSETrainingArguments

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "training_args"
ABLATIONS = RECIPES / "ablations"
BASE = "training_args/mocose-bert-base.yaml"


def _runs(grid: str, tmp_path) -> list[MoCoSETrainingArguments]:
    """The parsed arguments of every run of `grid`, in order (as `scripts/sweep.py` would launch them)."""
    _, base, runs = load_sweep(ABLATIONS / grid, tmp_path)
    assert base == BASE, grid
    return [parse_args([str(REPO / base), *run.command(base, "x", [])[3:]])[1] for run in runs]


def _values(runs, *fields) -> list[tuple]:
    return [tuple(getattr(args, f) for f in fields) for args in runs]


# Table 3: constant EMA decay.
TABLE3 = [0.5, 0.8, 0.85, 0.9, 0.95, 0.99]
# Table 4: projection depth x predictor depth.
TABLE4 = [(p, q) for p in (0, 1, 2, 3) for q in (1, 2, 3)]
# Table 5 rows: (fgsm_mode, token_shuffle, token_cutoff, feature_cutoff), each on top of dropout.
TABLE5 = [("off", False, 0.0, 0.0), ("previous", False, 0.0, 0.0), ("off", True, 0.0, 0.0),
          ("off", False, 0.1, 0.0), ("off", False, 0.0, 0.01), ("off", False, 0.0, 0.1)]
# Table 6a / Figure 10: embedding (key) dimension, queue 512.
TABLE6A = [256, 512, 768, 1024, 2048]
# Table 6b: batch size at queue 512.
TABLE6B = [32, 64, 128, 256]
# Table 7: queue size x initial size (none, 1/4, 1/2, all).
TABLE7 = [(k, s) for k in (128, 256, 512, 1024, 4096) for s in (0, k // 4, k // 2, k)]
# Table 8: queue 1024, initial size 128, batch 256; negatives by age.
TABLE8 = ["0:512", "256:768", "512:1024", "0:256,768:1024", None]
# Table 9: FGSM epsilon; None = no FGSM.
TABLE9 = [1e-9, 5e-9, 1e-8, 5e-8, None]

PAPER_GRIDS = {"table3-ema-decay.yaml", "table4-heads.yaml", "table5-augmentations.yaml",
               "table6a-embedding-dim.yaml", "table6b-batch-size.yaml", "table7-initial-queue.yaml",
               "table8-queue-slices.yaml", "table9-fgsm-epsilon.yaml", "a2-collapse.yaml"}


def test_every_grid_is_a_paper_table_or_a_named_extra(tmp_path):
    for path in sorted(ABLATIONS.glob("*.yaml")):
        name, _, _ = load_sweep(path, tmp_path)
        if path.name in PAPER_GRIDS:
            assert "Table" in path.read_text() or "Figure" in path.read_text(), path.name
            assert not name.endswith("-extra"), path.name
        else:
            assert path.stem.endswith("-extra") and name.endswith("-extra"), path.name
            assert "not in the paper" in path.read_text(), path.name
    assert PAPER_GRIDS <= {p.name for p in ABLATIONS.glob("*.yaml")}


def test_table3_constant_ema_decay(tmp_path):
    runs = _runs("table3-ema-decay.yaml", tmp_path)
    assert _values(runs, "ema_decay_start", "ema_decay_end") == [(eta, eta) for eta in TABLE3]


def test_table3_ramp_reading_is_an_extra_with_the_reference_codes_horizon(tmp_path):
    runs = _runs("table3-ema-decay-ramp-extra.yaml", tmp_path)
    ramps = [(a.ema_decay_start, a.ema_decay_end) for a in runs if a.ema_decay_horizon == 15000]
    assert ramps == [(eta, 1.0) for eta in TABLE3] + [(0.75, 1.0)]
    schedules = {(a.ema_decay_start, a.ema_decay_end) for a in runs if a.ema_decay_horizon is None}
    assert schedules == {(0.75, 0.95), (0.85, 1.0)}  # the final paper's and the draft's, over the run


def test_table4_projection_and_predictor_depths(tmp_path):
    assert _values(_runs("table4-heads.yaml", tmp_path), "projection_layers", "predictor_layers") == TABLE4


def test_table5_augmentations(tmp_path):
    runs = _runs("table5-augmentations.yaml", tmp_path)
    assert _values(runs, "fgsm_mode", "token_shuffle", "token_cutoff", "feature_cutoff") == TABLE5
    assert {(a.fgsm_epsilon, a.augmentation_views) for a in runs} == {(5e-9, "both")}  # as the reference code


def test_table6a_embedding_dimension_is_the_reference_out_size(tmp_path):
    runs = _runs("table6a-embedding-dim.yaml", tmp_path)
    assert _values(runs, "projection_dim", "queue_size", "projection_layers") == [(d, 512, 1) for d in TABLE6A]
    assert {a.predictor_dim for a in runs} == {None}  # the predictor follows the key width


def test_table6b_batch_size_at_queue_512(tmp_path):
    runs = _runs("table6b-batch-size.yaml", tmp_path)
    assert _values(runs, "per_device_train_batch_size", "queue_size", "queue_init_size") == [
        (b, 512, 128) for b in TABLE6B]


def test_table7_queue_and_initial_sizes(tmp_path):
    runs = _runs("table7-initial-queue.yaml", tmp_path)
    assert _values(runs, "queue_size", "queue_init_size") == TABLE7
    assert {a.per_device_train_batch_size for a in runs} == {64}


def test_table8_queue_slices_with_the_papers_batch_queue_and_initial_size(tmp_path):
    runs = _runs("table8-queue-slices.yaml", tmp_path)
    assert [a.queue_slice for a in runs] == TABLE8
    assert set(_values(runs, "per_device_train_batch_size", "queue_size", "queue_init_size")) == {(256, 1024, 128)}
    prefilled = _runs("table8-queue-slices-prefilled-extra.yaml", tmp_path)
    assert [a.queue_slice for a in prefilled] == TABLE8
    assert set(_values(prefilled, "per_device_train_batch_size", "queue_size", "queue_init_size")) == {(256, 1024, 1024)}
    small = _runs("table8-queue-slices-batch64-extra.yaml", tmp_path)
    assert set(_values(small, "per_device_train_batch_size", "queue_size", "queue_init_size")) == {(64, 1024, 128)}


def test_table9_fgsm_epsilon(tmp_path):
    runs = _runs("table9-fgsm-epsilon.yaml", tmp_path)
    assert [a.fgsm_epsilon if a.fgsm_mode == "previous" else None for a in runs] == TABLE9
    assert [a.fgsm_mode for a in runs] == ["previous"] * 4 + ["off"]
    assert {a.fgsm_epsilon_unit for a in runs} == {"absolute"}


def test_a2_collapse_figures_5_and_6(tmp_path):
    runs = _runs("a2-collapse.yaml", tmp_path)
    assert _values(runs, "predictor_layers", "ema_decay_start", "ema_decay_end") == [(0, 0.0, 0.0), (2, 0.0, 0.0)]


def test_paper_recipes_follow_the_final_papers_ema_and_say_how_to_get_the_reference_codes():
    for recipe in ("mocose-bert-base.yaml", "mocose-bert-large.yaml"):
        _, args = parse_args([str(RECIPES / recipe)])
        assert (args.ema_decay_start, args.ema_decay_end, args.ema_decay_horizon) == (0.75, 0.95, None)
        assert "ema_decay_horizon: 15000" in (RECIPES / recipe).read_text()
    _, una = parse_args([str(RECIPES / "mocose-una-bert-base.yaml")])
    assert una.hard_negatives == "una" and una.una_usage == "paper"


def test_mocose_paper_recipes_share_the_embedding_module_and_name_the_in_batch_departure():
    for recipe in ("mocose-bert-base.yaml", "mocose-bert-large.yaml", "mocose-una-bert-base.yaml"):
        _, args = parse_args([str(RECIPES / recipe)])
        assert args.shared_embeddings == "module", recipe  # the paper's Figure 2 and the reference code
        assert args.in_batch_negatives, recipe  # the reference code's; the paper's eq. 3 is the queue only
        assert "eq. 3" in (RECIPES / recipe).read_text(), recipe
    assert MoCoSETrainingArguments(output_dir="unused").shared_embeddings == "word"  # the library default


def test_ifcl_recipe_follows_the_ifcl_seed_and_says_what_the_full_method_needs():
    path = RECIPES / "ifcl-bert-base.yaml"
    _, args = parse_args([str(path)])
    assert args.method == "ifcl"
    assert args.sentence_pooling == "mean"  # the seed verifies with the mean of the last layer
    assert (args.eval_steps, args.save_steps) == (151, 151)
    text = path.read_text()
    assert "fraternal_column" in text and "fraternal_model_name_or_path" in text
    assert "w/o FI, TL" in text and "78.10" in text and "80.27" in text
    assert "the paper used 64" not in text


@pytest.mark.parametrize("claim", ["Defaults reproduce the MoCoSE paper"])
def test_training_arguments_docstring_says_what_the_defaults_are(claim):
    doc = MoCoSETrainingArguments.__doc__
    assert claim not in doc
    assert 'head_init="identity"' in doc and "head_learning_rate=1e-3" in doc
    assert "training_args/mocose-bert-base.yaml" in doc


def test_adapt_recipe_is_the_measured_mocose_adapt_variant(tmp_path, monkeypatch):
    """training_args/adapt-minilm.yaml, `mocose_adapt` of benchmark_quality.py and the ST example agree."""
    import importlib.util

    script, args = parse_args([str(RECIPES / "adapt-minilm.yaml"), "--output_dir", str(tmp_path)])
    assert script.model_name_or_path == "builtin:all-MiniLM-L6-v2"
    assert args.sentence_pooling == "mean" and args.method == "mocose"
    quality_script = REPO / "scripts" / "benchmarks" / "benchmark_quality.py"
    spec = importlib.util.spec_from_file_location("benchmark_quality", quality_script)
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    assert quality.ADAPT, "the adaptation recipe is measured as benchmark_quality's ADAPT"
    for key, value in quality.ADAPT.items():
        assert getattr(args, key) == value, key
    assert args.learning_rate < MoCoSETrainingArguments(output_dir=str(tmp_path)).learning_rate
    spec = importlib.util.spec_from_file_location("train_st_mocose", REPO / "examples" / "train_st_mocose.py")
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # dataclasses look their module up while it loads
    spec.loader.exec_module(example)
    assert example.ADAPTATION_DEFAULTS == quality.ADAPT
    _, loss_settings, st_args = example.parse_arguments(["--output_dir", str(tmp_path / "st")])
    for key, value in quality.ADAPT.items():  # each setting lands where the example's trainer or loss reads it
        assert getattr(loss_settings, key, None) == value or getattr(st_args, key, None) == value, key


# ESimCSE's BERT-base setting (Wu et al., COLING 2022), written out from the authors' code (github.com/caskcsg/sentemb,
# ESimCSE/run.sh's bert-base-uncased case and the train.py command it runs; trainers.py for the queue and the
# momentum encoder's eval mode), not read from the recipe.
ESIMCSE_BERT_BASE = {
    "method": "esimcse", "word_repetition_rate": 0.32, "queue_size": 160, "queue_init_size": 0,  # dup_rate, neg_size
    "ema_decay_start": 0.995, "ema_decay_end": 0.995, "target_dropout": False,  # momentum, model.eval()
    "contrastive_temperature": 0.05, "encoder_dropout": 0.1, "in_batch_negatives": True, "fgsm_mode": "off",
    "sentence_pooling": "cls", "predictor_layers": 0, "projection_layers": 0, "head_learning_rate": None,
    "head_init": "random",
    "learning_rate": 3e-5, "per_device_train_batch_size": 64, "max_seq_length": 32, "num_train_epochs": 1,
    "weight_decay": 0.0, "eval_steps": 125, "metric_for_best_model": "stsb_spearman", "load_best_model_at_end": True,
}


def test_esimcse_recipe_is_the_authors_bert_base_setting(tmp_path):
    path = RECIPES / "esimcse-bert-base.yaml"
    script, args = parse_args([str(path), "--output_dir", str(tmp_path)])
    assert script.model_name_or_path == "bert-base-uncased"
    assert {key: getattr(args, key) for key in ESIMCSE_BERT_BASE} == ESIMCSE_BERT_BASE
    assert args.queue_size == 2.5 * args.per_device_train_batch_size
    text = path.read_text()
    assert "caskcsg/sentemb" in text and "run.sh" in text and "78.27" in text


def test_esimcse_benchmark_variant_is_the_recipes_method(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_quality", REPO / "scripts" / "benchmarks" / "benchmark_quality.py")
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    assert quality.ESIMCSE.items() <= ESIMCSE_BERT_BASE.items()  # the method's values; the protocol sets the rest
    assert quality.ESIMCSE_QUEUE_PER_BATCH * 64 == ESIMCSE_BERT_BASE["queue_size"]


def test_pairs_recipe_is_the_measured_labelled_mocose_variant(tmp_path):
    """training_args/pairs-minilm.yaml trains what benchmark_quality.py measures as `labelled_mocose_b16`: MoCoSELoss
    with the library defaults at batch 16, queue 512 (128 at the start), lr 3e-5, tau 0.05, 32 tokens, mean pooling
    (the documented command's values), and reads a file of the labelled set in sentence-transformers' columns."""
    sys.path.insert(0, str(REPO))
    from scripts.benchmarks.labelled_variants import LABELLED_VARIANTS

    from hf_mocose import MoCoSELoss

    script, args = parse_args([str(RECIPES / "pairs-minilm.yaml"), "--output_dir", str(tmp_path)])
    assert script.model_name_or_path == "builtin:all-MiniLM-L6-v2" and script.train_file.endswith(".jsonl")
    kind, batch, _ = LABELLED_VARIANTS["labelled_mocose_b16"]
    assert kind == "mocose" and args.per_device_train_batch_size == batch
    measured = {"sentence_pooling": "mean", "queue_size": 512, "queue_init_size": 128, "learning_rate": 3e-5,
                "contrastive_temperature": 0.05, "max_seq_length": 32}
    assert {key: getattr(args, key) for key in measured} == measured
    defaults = inspect.signature(MoCoSELoss).parameters  # every other method setting: the loss's default
    for name in ("head_init", "head_learning_rate", "ema_decay_start", "ema_decay_end", "fgsm_mode", "fgsm_epsilon",
                 "method"):
        assert getattr(args, name) == defaults[name].default, name
    assert "python -m hf_mocose.data.labelled" in (RECIPES / "pairs-minilm.yaml").read_text()
