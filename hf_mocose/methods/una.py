"""UNA: unsupervised hard negative augmentation by TF-IDF word replacement (Shu et al.).

A sentence's UNA negative replaces its most informative (highest TF-IDF) words by other
words of similar corpus-level importance, so it looks like the anchor but means something
else. The statistics are built once per training corpus (one document per sentence) and
kept in O(V) arrays (`hf_mocose.methods.una_statistics`, re-exported here); this module holds the
settings, the replacement probabilities and the sampling. See `docs/una.md` for the formulas and
the choices made here.

    stats = UNAStatistics.from_corpus(sentences, cache_dir="una_cache")
    augmenter = UNAAugmenter(stats, alpha=0.5, window=4000, seed=0)
    negatives = augmenter.augment(batch_sentences)
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real
from typing import Sequence

import numpy as np

from .una_statistics import TOKEN_PATTERN, TOKEN_RE, UNAStatistics, corpus_fingerprint, tokenize

__all__ = [
    "DEFAULT_UNA_ALPHA", "DEFAULT_UNA_WINDOW", "DEFAULT_UNA_FREQUENCY", "TOKEN_PATTERN",
    "tokenize", "corpus_fingerprint", "replacement_probabilities", "resolve_window",
    "validate_una_alpha", "validate_una_window", "validate_una_frequency",
    "UNAStatistics", "UNAAugmenter",
]

DEFAULT_UNA_ALPHA = 0.5
DEFAULT_UNA_WINDOW = 4000
DEFAULT_UNA_FREQUENCY = 5

_WORD_CHAR = re.compile(r"\w")


# --------------------------------------------------------------------------- validation

def validate_una_alpha(alpha: float) -> float:
    """Returns `alpha` as a float if it is a finite number > 0, else raises `ValueError`."""
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"UNA alpha must be a finite number > 0, got {alpha!r}")
    return float(alpha)


def validate_una_window(window: int | float) -> int | float:
    """Checks a window: an int >= 1 (rank radius r) or a float in (0, 1) (fraction of the vocabulary)."""
    message = f"UNA window must be an int >= 1 or a float in (0, 1) (a vocabulary fraction), got {window!r}"
    if isinstance(window, bool) or not isinstance(window, Real):
        raise ValueError(message)
    if isinstance(window, Integral):
        if window < 1:
            raise ValueError(message)
        return int(window)
    if not 0.0 < float(window) < 1.0:  # also rejects NaN
        raise ValueError(message)
    return float(window)


def resolve_window(window: int | float, vocab_size: int) -> int:
    """Rank radius r: an int is used as is; a float f in (0, 1) gives r = max(1, ceil(f * vocab_size))."""
    window = validate_una_window(window)
    if isinstance(window, int):
        return window
    return max(1, math.ceil(window * vocab_size))


def validate_una_frequency(frequency: int) -> int:
    """Checks the trainer's "UNA negatives every f-th optimizer step" setting: an int f >= 1."""
    if isinstance(frequency, bool) or not isinstance(frequency, Integral) or frequency < 1:
        raise ValueError(f"UNA frequency must be an int >= 1 (every f-th step), got {frequency!r}")
    return int(frequency)


# ------------------------------------------------------------------ replacement probabilities

def _segment_probabilities(
    scores: np.ndarray, seg: np.ndarray, n_seg: int, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """p_i for tokens grouped into non-empty sentences (`seg[i]` = sentence of token i).

    Returns `(p, flat)`: `flat[j]` marks sentence j as "all scores equal", where the formula is
    0/0 and the caller replaces exactly one token instead (p is 0 there).
    """
    lengths = np.bincount(seg, minlength=n_seg)
    low = np.full(n_seg, np.inf)
    high = np.full(n_seg, -np.inf)
    np.minimum.at(low, seg, scores)
    np.maximum.at(high, seg, scores)
    shifted = scores - low[seg]
    total = np.bincount(seg, weights=shifted, minlength=n_seg)
    # Relative tolerance: equal words have bit-identical scores, but guard against rounding.
    tol = 1e-12 * np.maximum(1.0, np.abs(high))
    flat = (high - low) <= tol
    safe_total = np.where(flat, 1.0, total)
    p = np.minimum(alpha * lengths[seg] * shifted / safe_total[seg], 1.0)
    # The top-scoring token (every occurrence of a tied maximum) is always replaced.
    p[scores >= high[seg] - tol[seg]] = 1.0
    p[flat[seg]] = 0.0
    return p, flat


def replacement_probabilities(scores: Sequence[float], alpha: float = DEFAULT_UNA_ALPHA) -> np.ndarray:
    """Marginal replacement probability of each token of one sentence, given its scores.

    p_i = min(1, alpha * n * (s_i - min s) / sum_k (s_k - min s)), and 1 for the top score.
    When all n scores are equal (n = 1 included) exactly one uniformly chosen token is
    replaced, so each gets the marginal 1/n (these draws are not independent).
    """
    alpha = validate_una_alpha(alpha)
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if scores.size == 0:
        return scores.copy()
    p, flat = _segment_probabilities(scores, np.zeros(scores.size, np.int64), 1, alpha)
    if flat[0]:
        p[:] = 1.0 / scores.size
    return p


def _fuses(left: str, right: str) -> bool:
    """Whether two adjacent characters would fall into one `TOKEN_PATTERN` token."""
    return bool(left) and bool(right) and _WORD_CHAR.match(left) is not None and _WORD_CHAR.match(right) is not None


def _match_case(word: str, original: str) -> str:
    """Gives a (lowercase) replacement the capitalisation pattern of the word it replaces."""
    if len(original) > 1 and original.isupper():
        return word.upper()
    if original[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


# ------------------------------------------------------------------------- augmenter

class UNAAugmenter:
    """Draws UNA hard negatives from `UNAStatistics`.

    Args:
        statistics: the corpus statistics.
        alpha: replacement strength α > 0 (default 0.5).
        window: rank radius r, an int >= 1, or a float in (0, 1) meaning ceil(f * V) (default 4000).
        seed: seed of the internal `numpy.random.Generator` (anything `default_rng` takes,
            e.g. `[seed, step]`).
    """

    def __init__(self, statistics: UNAStatistics, alpha: float = DEFAULT_UNA_ALPHA,
                 window: int | float = DEFAULT_UNA_WINDOW, seed=0):
        if not isinstance(statistics, UNAStatistics):
            raise TypeError(f"statistics must be a UNAStatistics, got {type(statistics).__name__}")
        self.statistics = statistics
        self.alpha = validate_una_alpha(alpha)
        self.window = validate_una_window(window)
        self.radius = resolve_window(self.window, statistics.vocab_size)
        self.reseed(seed)

    def reseed(self, seed) -> None:
        """Restarts the internal generator, e.g. with `[base_seed, global_step]` on every rank."""
        self.rng = np.random.default_rng(seed)

    def _generator(self, rng) -> np.random.Generator:
        if rng is None:
            return self.rng
        return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def sample_replacement_ids(self, word_ids: Sequence[int], rng=None) -> np.ndarray:
        """One replacement id per vocabulary id, drawn ∝ M(v) from rank window [k-r, k+r] minus k.

        Returns -1 where the window holds no other word (a one-word vocabulary).
        """
        ids = np.asarray(word_ids, dtype=np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.statistics.vocab_size):
            raise ValueError(f"word ids must lie in [0, {self.statistics.vocab_size}), got {word_ids!r}")
        return self._draw(self.statistics.rank[ids], np.ones(ids.size, bool), self._generator(rng))

    def _draw(self, pos: np.ndarray, has_self: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Samples from rank windows around `pos`; `has_self` False means `pos` is an OOV
        word's insertion point (window [q-r, q+r-1], nothing to exclude)."""
        st, r = self.statistics, self.radius
        size, cum, sorted_m = st.vocab_size, st.cumulative, st.sorted_max_score
        lo = np.maximum(pos - r, 0)
        hi = np.minimum(np.where(has_self, pos + r, pos + r - 1), size - 1)  # inclusive
        self_mass = np.where(has_self, sorted_m[np.minimum(pos, size - 1)], 0.0)
        below = np.where(has_self, cum[pos] - cum[lo], np.inf)  # window mass ranked below self
        total = cum[hi + 1] - cum[lo] - self_mass
        n_cand = hi - lo + 1 - has_self
        u = rng.random(pos.size)
        # Inverse-CDF over the cumulative sums, skipping self's slice: O(log V) per draw.
        offset = u * total
        target = cum[lo] + offset + np.where(offset >= below, self_mass, 0.0)
        picked = np.clip(np.searchsorted(cum, target, side="right") - 1, lo, hi)
        # A window whose other words all have M = 0 (idf 0): fall back to uniform.
        uniform = lo + np.minimum((u * n_cand).astype(np.int64), np.maximum(n_cand - 1, 0))
        uniform += has_self & (uniform >= pos)
        picked = np.where(total > 0, picked, uniform)
        # Rounding at a slice edge could land on self; step to a neighbour inside the window.
        clash = has_self & (picked == pos)
        picked[clash] = np.where(picked[clash] > lo[clash], picked[clash] - 1, picked[clash] + 1)
        return np.where(n_cand > 0, st.order[np.minimum(picked, size - 1)], -1)

    def augment(self, sentences: Sequence[str], rng=None) -> list[str]:
        """Returns the UNA hard negative of each sentence.

        Tokens are chosen with `replacement_probabilities` (independently, except that a sentence
        whose scores are all equal gets exactly one uniformly chosen replacement), then replaced
        by `sample_replacement_ids`-style draws; everything between tokens keeps its original
        text, and a replacement copies the capitalisation of the word it replaces.
        `rng` (seed or Generator) overrides the internal generator for this call only.
        """
        if isinstance(sentences, str):
            raise TypeError("augment takes a list of sentences, not a single str")
        sentences = list(sentences)
        gen = self._generator(rng)
        st = self.statistics
        matches = [list(TOKEN_RE.finditer(s)) for s in sentences]
        token_lists = [[m.group().lower() for m in ms] for ms in matches]
        ids, scores, seg = st.score_batch(token_lists)
        if ids.size == 0:
            return sentences
        # Compact sentence numbering over the non-empty ones, for the per-sentence reductions.
        nonempty, seg_c = np.unique(seg, return_inverse=True)
        p, flat = _segment_probabilities(scores, seg_c, nonempty.size, self.alpha)
        replace = gen.random(ids.size) < p
        if flat.any():
            starts = np.searchsorted(seg_c, np.flatnonzero(flat))
            lengths = np.bincount(seg_c)[flat]
            pick = np.minimum((gen.random(lengths.size) * lengths).astype(np.int64), lengths - 1)
            replace[starts + pick] = True
        where = np.flatnonzero(replace)
        has_self = ids[where] >= 0
        # OOV words sit where their own score would rank among the M values.
        pos = np.where(has_self, st.rank[np.maximum(ids[where], 0)],
                       np.searchsorted(st.sorted_max_score, scores[where]))
        new_ids = self._draw(pos, has_self, gen)
        offsets = np.concatenate(([0], np.cumsum([len(t) for t in token_lists])))
        out = list(sentences)
        edits: dict[int, list[tuple[int, int]]] = {}
        for token, new_id in zip(where.tolist(), new_ids.tolist()):
            if new_id >= 0:
                sent = int(seg[token])
                edits.setdefault(sent, []).append((token - int(offsets[sent]), new_id))
        for sent, changes in edits.items():
            text, pieces, prev, last = sentences[sent], [], 0, ""
            for local, new_id in changes:  # ascending token order
                start, end = matches[sent][local].span()
                gap = text[prev:start]
                word = _match_case(st.vocabulary[new_id], text[start:end])
                # Keep token boundaries: a word put in place of "." in "ran." must not fuse
                # with "ran", so the negative re-tokenises into as many tokens as the anchor.
                head = " " if _fuses(gap[-1:] or last, word[0]) else ""
                tail = " " if _fuses(word[-1], text[end:end + 1]) else ""
                pieces += [gap, head, word, tail]
                last, prev = (word + tail)[-1], end
            pieces.append(text[prev:])
            out[sent] = "".join(pieces)
        return out

    __call__ = augment
