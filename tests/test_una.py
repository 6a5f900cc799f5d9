"""UNA statistics and augmentation (hf_mocose/augmentation/una.py): formulas, sampling, determinism, cache."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from hf_mocose.augmentation.una import (
    DEFAULT_UNA_ALPHA,
    DEFAULT_UNA_FREQUENCY,
    DEFAULT_UNA_WINDOW,
    UNAAugmenter,
    UNAStatistics,
    replacement_probabilities,
    resolve_window,
    tokenize,
    validate_una_frequency,
)

CORPUS_FILE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "corpus" / "unlabeled_en.txt"

# N = 4 documents. df: the 3, cat 2, sat 2, dog 2, a 1, ran 1.
CORPUS = ["the cat sat", "the dog sat", "a cat ran", "the the dog"]
L43, L53 = math.log(4 / 3), math.log(5 / 3)  # tf of a word seen once / twice in a 3-token sentence


@pytest.fixture
def stats() -> UNAStatistics:
    return UNAStatistics.build(CORPUS)


def window_stats(size: int = 20, seed: int = 3) -> UNAStatistics:
    """A synthetic vocabulary with distinct M values, for the sampling tests."""
    m = np.random.default_rng(seed).uniform(0.1, 2.0, size)
    return UNAStatistics([f"w{i:02d}" for i in range(size)], np.ones(size), m, n_documents=10)


def test_defaults():
    assert (DEFAULT_UNA_ALPHA, DEFAULT_UNA_WINDOW, DEFAULT_UNA_FREQUENCY) == (0.5, 4000, 5)


def test_tokenize_lowercases_words_and_splits_symbols():
    assert tokenize("Hello, World! It's 3pm.") == ["hello", ",", "world", "!", "it", "'", "s", "3pm", "."]
    assert tokenize("   ") == []


def test_statistics_match_hand_computed_values(stats):
    assert stats.vocabulary == ["the", "cat", "sat", "dog", "a", "ran"]
    assert stats.n_documents == 4
    idf = [math.log(4 / 3), math.log(2), math.log(2), math.log(2), math.log(4), math.log(4)]
    np.testing.assert_allclose(stats.idf, idf)
    # "the" scores L43*idf in "the cat sat"/"the dog sat" but L53*idf in "the the dog": M takes the max.
    m = [L53 * idf[0], L43 * idf[1], L43 * idf[2], L43 * idf[3], L43 * idf[4], L43 * idf[5]]
    np.testing.assert_allclose(stats.max_score, m)
    # Ascending M, ties (cat, sat, dog) kept in id order; cumulative sums start at 0.
    np.testing.assert_array_equal(stats.order, [0, 1, 2, 3, 4, 5])
    np.testing.assert_allclose(stats.cumulative, np.concatenate(([0], np.cumsum(m))))


def test_score_tokens_uses_sentence_tf_and_oov_idf(stats):
    scores = stats.score_tokens(["the", "zzz", "the"])
    # n = 3: "the" twice -> ln(1 + 2/3) * ln(4/3); OOV "zzz" once -> ln(1 + 1/3) * ln(N / 1).
    np.testing.assert_allclose(scores, [L53 * math.log(4 / 3), L43 * math.log(4), L53 * math.log(4 / 3)])


def test_replacement_probabilities_formula():
    # shifted [0, 1, 2, 9], sum 12, n = 4: p = 0.5 * 4 * shifted / 12, the top capped at 1.
    np.testing.assert_allclose(replacement_probabilities([1, 2, 3, 10], 0.5), [0, 1 / 6, 1 / 3, 1])
    # alpha large: everything above the minimum is capped at 1.
    np.testing.assert_allclose(replacement_probabilities([1, 2, 3, 10], 10.0), [0, 1, 1, 1])
    # The formula gives the top 2 * 3 / 7 < 1, but the top token is always replaced.
    np.testing.assert_allclose(replacement_probabilities([0, 2, 2, 3], 0.5), [0, 4 / 7, 4 / 7, 1])
    # All equal (the reference divides 0 by 0): one uniform replacement, marginal 1/n.
    np.testing.assert_allclose(replacement_probabilities([2.0, 2.0, 2.0]), [1 / 3] * 3)
    np.testing.assert_allclose(replacement_probabilities([0.7]), [1.0])
    assert replacement_probabilities([]).size == 0


def test_top_token_is_always_replaced(stats):
    # Scores: the < cat < ran. With a tiny alpha only the forced top token changes.
    augmenter = UNAAugmenter(stats, alpha=1e-9, window=2, seed=0)
    for _ in range(50):
        out = tokenize(augmenter.augment(["the cat ran"])[0])
        assert out[:2] == ["the", "cat"]
        # ran has rank 5: window ranks [3, 5] minus itself -> dog or a.
        assert out[2] in {"dog", "a"}


def test_all_equal_scores_replace_exactly_one_token(stats):
    augmenter = UNAAugmenter(stats, window=2, seed=0)
    assert stats.score_tokens(["cat", "sat"])[0] == stats.score_tokens(["cat", "sat"])[1]
    # Mixed batch: the all-equal sentences share the vectorised path with a normal one.
    outputs = augmenter.augment(["cat sat", "dog", "the cat ran"] * 500)
    positions = []
    for out in outputs[0::3]:
        changed = [a != b for a, b in zip(tokenize(out), ["cat", "sat"])]
        assert sum(changed) == 1
        positions.append(changed.index(True))
    assert 200 < sum(positions) < 300  # uniform over the two positions
    assert all(tokenize(out) != ["dog"] for out in outputs[1::3])  # n = 1: always replaced


def test_batch_replacement_rates_follow_the_formula(stats):
    sentence = ["the", "cat", "sat", "ran", "the"]
    p = replacement_probabilities(stats.score_tokens(sentence), 0.5)
    assert p.max() == 1 and np.any((p > 0) & (p < 1))  # forced, fractional and zero rates
    draws = 4000
    outputs = UNAAugmenter(stats, window=2, seed=1).augment([" ".join(sentence)] * draws)
    changed = np.array([[a != b for a, b in zip(tokenize(o), sentence)] for o in outputs])
    rate = changed.mean(axis=0)
    assert np.all(np.abs(rate - p) <= 4 * np.sqrt(p * (1 - p) / draws) + 1e-9)


@pytest.mark.parametrize("rank", [10, 1, 19])
def test_window_sampling_is_proportional_to_m(rank):
    stats = window_stats()
    augmenter = UNAAugmenter(stats, window=3, seed=0)
    word = int(stats.order[rank])
    draws = augmenter.sample_replacement_ids(np.full(20000, word))
    drawn_ranks = stats.rank[draws]
    window = [k for k in range(max(0, rank - 3), min(19, rank + 3) + 1) if k != rank]
    assert word not in draws
    assert set(drawn_ranks.tolist()) <= set(window)
    observed = np.array([(drawn_ranks == k).sum() for k in window])
    expected = stats.sorted_max_score[window] / stats.sorted_max_score[window].sum() * draws.size
    assert chisquare(observed, expected).pvalue > 1e-3


def test_window_fraction_and_uniform_fallback():
    assert resolve_window(0.1, 20) == 2 and resolve_window(0.001, 20) == 1 and resolve_window(7, 20) == 7
    assert UNAAugmenter(window_stats(), window=0.1).radius == 2
    # Every M = 0 (words present in every document): draws fall back to uniform in the window.
    zero = UNAStatistics(list("abcde"), np.zeros(5), np.zeros(5), n_documents=3)
    draws = UNAAugmenter(zero, window=2, seed=0).sample_replacement_ids(np.full(3000, 2))
    counts = np.bincount(draws, minlength=5)
    assert counts[2] == 0 and chisquare(counts[[0, 1, 3, 4]]).pvalue > 1e-3
    # A one-word vocabulary has nothing to swap in: the sentence is left as it is.
    single = UNAStatistics(["x"], np.ones(1), np.ones(1), n_documents=1)
    assert UNAAugmenter(single, seed=0).augment(["x x", "X"]) == ["x x", "X"]


def test_oov_word_samples_around_its_own_score(stats):
    # "zzz" alone scores ln2 * ln4, above every M: its window is the top 2 ranks (a, ran).
    outputs = UNAAugmenter(stats, window=2, seed=0).augment(["zzz"] * 200)
    assert {o for o in outputs} == {"a", "ran"}


def test_surface_form_is_kept_outside_replacements(stats):
    augmenter = UNAAugmenter(stats, alpha=1e-9, window=2, seed=0)
    out = augmenter.augment(["  The\tcat  RAN \n"])[0]
    assert out.startswith("  The\tcat  ") and out.endswith(" \n")
    assert out[len("  The\tcat  "):-2] in {"DOG", "A"}  # casing copied from "RAN"
    # A word replacing a symbol must not fuse with its neighbours: token count is preserved.
    for out in UNAAugmenter(stats, window=2, seed=0).augment(["ran.the", "x.y", "a cat,ran."] * 30):
        assert len(tokenize(out)) in {3, 5}


def test_determinism_and_reseeding(stats):
    batch = ["the cat sat", "the dog sat", "a cat ran", "the the dog", "cat dog sat ran"] * 8
    first = UNAAugmenter(stats, window=2, seed=5).augment(batch)
    assert UNAAugmenter(stats, window=2, seed=5).augment(batch) == first
    assert UNAAugmenter(stats, window=2, seed=6).augment(batch) != first
    augmenter = UNAAugmenter(stats, window=2, seed=5)
    assert augmenter.augment(batch, rng=123) == UNAAugmenter(stats, window=2, seed=123).augment(batch)
    assert augmenter.augment(batch) == first  # a per-call rng leaves the internal generator alone
    augmenter.reseed(5)
    assert augmenter.augment(batch) == first
    rng_a, rng_b = np.random.default_rng([5, 10]), np.random.default_rng([5, 10])
    assert augmenter.augment(batch, rng=rng_a) == augmenter.augment(batch, rng=rng_b)


def test_cache_round_trip_and_fingerprint_invalidation(tmp_path, monkeypatch):
    built = UNAStatistics.from_corpus(CORPUS, cache_dir=tmp_path)
    assert (tmp_path / "una_stats.npz").is_file() and (tmp_path / "una_vocab.json").is_file()
    loaded = UNAStatistics.load(tmp_path)
    assert loaded.vocabulary == built.vocabulary and loaded.fingerprint == built.fingerprint
    np.testing.assert_array_equal(loaded.idf, built.idf)
    np.testing.assert_array_equal(loaded.max_score, built.max_score)
    assert UNAAugmenter(loaded, seed=1).augment(CORPUS) == UNAAugmenter(built, seed=1).augment(CORPUS)

    def no_build(*args, **kwargs):
        raise AssertionError("the matching cache should have been reused")

    with monkeypatch.context() as m:
        m.setattr(UNAStatistics, "build", no_build)
        assert UNAStatistics.from_corpus(list(CORPUS), cache_dir=tmp_path).vocabulary == built.vocabulary
    # Another corpus (even a changed sentence boundary) has another fingerprint: rebuilt and re-cached.
    changed = ["the cat", "sat", *CORPUS[1:]]
    rebuilt = UNAStatistics.from_corpus(changed, cache_dir=tmp_path)
    assert rebuilt.fingerprint != built.fingerprint and rebuilt.n_documents == 5
    assert UNAStatistics.load(tmp_path).fingerprint == rebuilt.fingerprint
    # A damaged cache is rebuilt rather than trusted.
    (tmp_path / "una_vocab.json").write_text("{not json")
    assert UNAStatistics.from_corpus(CORPUS, cache_dir=tmp_path).fingerprint == built.fingerprint
    assert json.loads((tmp_path / "una_vocab.json").read_text())["fingerprint"] == built.fingerprint


@pytest.mark.parametrize("alpha", [0, -0.5, float("nan"), float("inf"), True])
def test_bad_alpha_is_rejected(stats, alpha):
    with pytest.raises(ValueError, match=f"alpha.*{alpha!r}"):
        UNAAugmenter(stats, alpha=alpha)


@pytest.mark.parametrize("window", [0, -3, 0.0, 1.0, 1.5, float("nan"), True, "10"])
def test_bad_window_is_rejected(stats, window):
    with pytest.raises(ValueError, match="window"):
        UNAAugmenter(stats, window=window)


def test_bad_corpus_and_frequency_are_rejected():
    with pytest.raises(ValueError, match="0 sentences"):
        UNAStatistics.build([])
    with pytest.raises(ValueError, match="0 sentences"):
        UNAStatistics.from_corpus([])
    with pytest.raises(ValueError, match="no tokens"):
        UNAStatistics.build(["", "   "])
    with pytest.raises(TypeError, match="sentence 1"):
        UNAStatistics.build(["ok", None])
    with pytest.raises(TypeError, match="list of sentences"):
        UNAAugmenter(UNAStatistics.build(CORPUS)).augment("the cat")
    assert validate_una_frequency(5) == 5 and validate_una_frequency(1) == 1
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"frequency.*{bad!r}"):
            validate_una_frequency(bad)


@pytest.mark.skipif(not CORPUS_FILE.is_file(), reason=f"training corpus not found at {CORPUS_FILE}")
def test_real_corpus_statistics_are_linear_in_vocabulary():
    sentences = CORPUS_FILE.read_text(encoding="utf-8").splitlines()
    start = time.perf_counter()
    stats = UNAStatistics.build(sentences)
    build_s = time.perf_counter() - start
    size = stats.vocab_size
    assert stats.n_documents == len(sentences) and 1000 < size < len(sentences) * 10
    for array in (stats.idf, stats.max_score, stats.order, stats.rank, stats.sorted_max_score):
        assert array.shape == (size,)
    assert stats.nbytes <= 64 * size  # O(V), not O(V) per entry as in the reference
    assert np.all(stats.max_score >= 0) and np.all(np.isfinite(stats.max_score))
    augmenter = UNAAugmenter(stats, seed=0)
    start = time.perf_counter()
    negatives = augmenter.augment(sentences[:64])
    batch_ms = (time.perf_counter() - start) * 1000
    print(f"UNA: V={size}, build {build_s:.2f} s, batch of 64 in {batch_ms:.1f} ms")
    assert sum(a != b for a, b in zip(negatives, sentences[:64])) >= 60
