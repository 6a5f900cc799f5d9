"""UNA: unsupervised hard negative augmentation by TF-IDF word replacement (Shu et al.).

A sentence's UNA negative replaces its highest TF-IDF words by words of similar corpus-level importance.
`UNAStatistics` holds each word's idf and largest tf-idf score (one document per sentence) in O(V) arrays,
cached keyed by a corpus fingerprint; `UNAAugmenter` draws the replacements. Formulas: `docs/una.md`.

    stats = UNAStatistics.from_corpus(sentences, cache_dir="una_cache")
    augmenter = UNAAugmenter(stats, alpha=0.5, window=4000, seed=0)
    negatives = augmenter.augment(batch_sentences)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import tempfile
from numbers import Integral, Real
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

logger = logging.getLogger(__name__)

DEFAULT_UNA_ALPHA = 0.5
DEFAULT_UNA_WINDOW = 4000
DEFAULT_UNA_FREQUENCY = 5
#: Word runs or single non-space symbols; each match is lowercased to give a token.
TOKEN_PATTERN = r"\w+|[^\w\s]"
TOKEN_RE = re.compile(TOKEN_PATTERN)
_WORD_CHAR = re.compile(r"\w")
# Bumped whenever tokenisation or the statistics change, so old caches are rebuilt.
_FORMAT_VERSION = 1
_STATS_FILE = "una_stats.npz"
_VOCAB_FILE = "una_vocab.json"


def tokenize(sentence: str) -> list[str]:
    """`TOKEN_PATTERN`'s matches, lowercased after matching: `UNAAugmenter.augment` rebuilds the sentence from
    the same spans of the original text (for ordinary text, matching `sentence.lower()` agrees)."""
    return [t.lower() for t in TOKEN_RE.findall(sentence)]


def corpus_fingerprint(sentences: Iterable[str]) -> str:
    """sha256 of the sentences (length-prefixed, so boundaries matter) and the format version."""
    digest = hashlib.sha256(f"una-v{_FORMAT_VERSION}|{TOKEN_PATTERN}|".encode())
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"corpus sentence {i} is a {type(sentence).__name__}, not a str")
        data = sentence.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


class UNAStatistics:
    """Corpus TF-IDF statistics for UNA, O(V) arrays indexed by vocabulary id: `vocabulary` (first-appearance
    order), `idf` = ln(N / df(w)), `max_score` M(w) (largest tf-idf of w), `n_documents` N (empty sentences
    included), `fingerprint`, `order` / `rank` (ids by ascending M, ties by id, and each id's position there) and
    `cumulative` = `[0, cumsum(M[order])]`, so the M-mass of a rank window is two lookups."""

    def __init__(self, vocabulary: Sequence[str], idf: np.ndarray, max_score: np.ndarray,
                 n_documents: int, fingerprint: str | None = None):
        self.vocabulary = list(vocabulary)
        self.idf = np.ascontiguousarray(idf, dtype=np.float64)
        self.max_score = np.ascontiguousarray(max_score, dtype=np.float64)
        size = len(self.vocabulary)
        if size == 0 or self.idf.shape != (size,) or self.max_score.shape != (size,):
            raise ValueError(f"need a non-empty vocabulary ({size} words) and idf {self.idf.shape} and "
                             f"max_score {self.max_score.shape} of shape ({size},)")
        if n_documents < 1:
            raise ValueError(f"n_documents must be >= 1, got {n_documents!r}")
        self.n_documents = int(n_documents)
        self.fingerprint = fingerprint
        self.word_to_id = {word: i for i, word in enumerate(self.vocabulary)}
        if len(self.word_to_id) != size:
            raise ValueError("the UNA vocabulary contains duplicate words")
        self.order = np.argsort(self.max_score, kind="stable")
        self.rank = np.empty(size, dtype=np.int64)
        self.rank[self.order] = np.arange(size)
        self.sorted_max_score = self.max_score[self.order]
        self.cumulative = np.concatenate(([0.0], np.cumsum(self.sorted_max_score)))

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    @property
    def nbytes(self) -> int:
        """Bytes held by the numpy arrays (the vocabulary strings and dict not counted)."""
        return sum(a.nbytes for a in (self.idf, self.max_score, self.order, self.rank, self.sorted_max_score,
                                      self.cumulative))

    @classmethod
    def build(cls, sentences: Iterable[str], fingerprint: str | None = None) -> "UNAStatistics":
        """Computes the statistics of `sentences` (one document each) through a CSR count matrix."""
        sentences = list(sentences)
        fingerprint = fingerprint or corpus_fingerprint(sentences)  # also checks that every sentence is a str
        if (n_docs := len(sentences)) == 0:
            raise ValueError("UNA needs a non-empty corpus, got 0 sentences")
        word_to_id: dict[str, int] = {}
        docs = [[word_to_id.setdefault(t, len(word_to_id)) for t in tokenize(sentence)] for sentence in sentences]
        if (size := len(word_to_id)) == 0:
            raise ValueError(f"UNA corpus of {n_docs} sentences has no tokens")
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=n_docs)
        cols = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.int64, count=int(lengths.sum()))
        rows = np.repeat(np.arange(n_docs), lengths)
        counts = sp.csr_matrix((np.ones(cols.size, np.int32), (rows, cols)), shape=(n_docs, size))
        counts.sum_duplicates()  # one entry per (sentence, word) holding count(w, s)
        df = np.bincount(counts.indices, minlength=size)
        idf = np.log(n_docs / df)
        entry_rows = np.repeat(np.arange(n_docs), np.diff(counts.indptr))
        scores = np.log1p(counts.data / lengths[entry_rows]) * idf[counts.indices]
        # Per-word maximum: every score is >= 0, so a column's implicit zeros never win.
        tfidf = sp.csr_matrix((scores, counts.indices, counts.indptr), shape=counts.shape)
        max_score = tfidf.max(axis=0).toarray().ravel()
        return cls(list(word_to_id), idf, max_score, n_docs, fingerprint)

    @classmethod
    def from_corpus(cls, sentences: Iterable[str], cache_dir: str | os.PathLike | None = None) -> "UNAStatistics":
        """Loads the statistics from `cache_dir` when its fingerprint matches; else (missing, unreadable or stale
        cache) builds them and writes them back to `cache_dir`."""
        sentences = list(sentences)
        fingerprint = corpus_fingerprint(sentences)
        if cache_dir is not None:
            try:
                if (cached := cls.load(cache_dir)).fingerprint == fingerprint:
                    return cached
            except FileNotFoundError:
                pass
            except (OSError, ValueError, KeyError, TypeError) as err:
                logger.warning("Ignoring unreadable UNA cache in %s: %s", cache_dir, err)
        stats = cls.build(sentences, fingerprint)
        if cache_dir is not None:
            stats.save(cache_dir)
        return stats

    def save(self, directory: str | os.PathLike) -> None:
        """Writes `una_stats.npz` and `una_vocab.json` to `directory` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {"format_version": _FORMAT_VERSION, "token_pattern": TOKEN_PATTERN, "fingerprint": self.fingerprint,
                "n_documents": self.n_documents, "vocabulary": self.vocabulary}
        # The fingerprint also goes into the npz so a load can tell if the two files belong together.
        _atomic_write(directory / _STATS_FILE, lambda f: np.savez(
            f, idf=self.idf, max_score=self.max_score, fingerprint=np.array(self.fingerprint or "")))
        _atomic_write(directory / _VOCAB_FILE, lambda f: f.write(json.dumps(meta, ensure_ascii=False).encode()))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "UNAStatistics":
        """Reads statistics written by `save`; raises `ValueError` for a foreign or mismatched cache."""
        directory = Path(directory)
        meta = json.loads((directory / _VOCAB_FILE).read_text(encoding="utf-8"))
        if meta.get("format_version") != _FORMAT_VERSION or meta.get("token_pattern") != TOKEN_PATTERN:
            raise ValueError(f"UNA cache in {directory} has another format or tokeniser")
        with np.load(directory / _STATS_FILE, allow_pickle=False) as arrays:
            idf, max_score, npz_fingerprint = arrays["idf"], arrays["max_score"], str(arrays["fingerprint"])
        if npz_fingerprint != (meta["fingerprint"] or ""):
            raise ValueError(f"UNA cache files in {directory} come from different corpora")
        return cls(meta["vocabulary"], idf, max_score, meta["n_documents"], meta["fingerprint"])

    def score_tokens(self, tokens: Sequence[str]) -> np.ndarray:
        """tf-idf score of each token of one tokenised sentence (OOV words: idf = ln N, as if df = 1)."""
        return self.score_batch([list(tokens)])[1]

    def score_batch(self, token_lists: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat `(ids, scores, sentence_of_token)` of shape `(total tokens,)` for a batch of tokenised sentences:
        vocabulary id (-1 for OOV words), tf-idf score, index of the sentence."""
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        flat = [t for tokens in token_lists for t in tokens]
        get = self.word_to_id.get
        ids = np.fromiter((get(t, -1) for t in flat), dtype=np.int64, count=len(flat))
        seg = np.repeat(np.arange(len(token_lists)), lengths)
        if ids.size == 0:
            return ids, np.zeros(0), seg
        # count(w, s) via unique (sentence, word) keys; distinct OOV words get temporary ids >= V.
        keys = ids.copy()
        oov = ids < 0
        width = self.vocab_size
        if oov.any():
            _, oov_ids = np.unique(np.array(flat, dtype=object)[oov], return_inverse=True)
            keys[oov] = width + oov_ids
            width += int(oov_ids.max()) + 1
        _, inverse, counts = np.unique(seg * width + keys, return_inverse=True, return_counts=True)
        tf = np.log1p(counts[inverse] / lengths[seg])
        idf = np.where(oov, math.log(self.n_documents), self.idf[np.maximum(ids, 0)])
        return ids, tf * idf, seg


def _atomic_write(path: Path, write) -> None:
    # Several ranks may build the same cache at once: write aside, then rename over.
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as f:
        try:
            write(f)
        except BaseException:
            os.unlink(f.name)
            raise
    os.replace(f.name, path)


def validate_una_alpha(alpha: float) -> float:
    """Returns `alpha` as a float if it is a finite number > 0, else raises `ValueError`."""
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"UNA alpha must be a finite number > 0, got {alpha!r}")
    return float(alpha)


def validate_una_window(window: int | float) -> int | float:
    """Checks a window: an int >= 1 (rank radius r) or a float in (0, 1) (fraction of the vocabulary)."""
    if isinstance(window, Integral) and not isinstance(window, bool) and window >= 1:
        return int(window)
    if isinstance(window, Real) and not isinstance(window, (bool, Integral)) and 0.0 < float(window) < 1.0:
        return float(window)  # the comparison also rejects NaN
    raise ValueError(f"UNA window must be an int >= 1 or a float in (0, 1) (a vocabulary fraction), got {window!r}")


def resolve_window(window: int | float, vocab_size: int) -> int:
    """Rank radius r: an int is used as is; a float f in (0, 1) gives r = max(1, ceil(f * vocab_size))."""
    window = validate_una_window(window)
    return window if isinstance(window, int) else max(1, math.ceil(window * vocab_size))


def validate_una_frequency(frequency: int) -> int:
    """Checks the trainer's "UNA negatives every f-th optimizer step" setting: an int f >= 1."""
    if isinstance(frequency, bool) or not isinstance(frequency, Integral) or frequency < 1:
        raise ValueError(f"UNA frequency must be an int >= 1 (every f-th step), got {frequency!r}")
    return int(frequency)


def _segment_probabilities(scores: np.ndarray, seg: np.ndarray, n_seg: int, alpha: float):
    """`(p, flat)`: p_i for tokens grouped into non-empty sentences (`seg[i]` = sentence of token i); `flat[j]`
    marks sentence j as "all scores equal", where the formula is 0/0 and the caller replaces exactly one token
    instead (p is 0 there)."""
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
    """Marginal replacement probability of each token of one sentence, given its scores: p_i = min(1, alpha * n *
    (s_i - min s) / sum_k (s_k - min s)), and 1 for the top score. When all n scores are equal (n = 1 included)
    exactly one uniformly chosen token is replaced, so each gets the marginal 1/n (not independent draws)."""
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
    return bool(left and right and _WORD_CHAR.match(left) and _WORD_CHAR.match(right))


def _match_case(word: str, original: str) -> str:
    """A (lowercase) replacement with the capitalisation pattern of the word it replaces."""
    if len(original) > 1 and original.isupper():
        return word.upper()
    return word[:1].upper() + word[1:] if original[:1].isupper() else word


class UNAAugmenter:
    """Draws UNA hard negatives from `UNAStatistics`: replacement strength `alpha` > 0; rank radius `window`, an
    int >= 1, or a float f in (0, 1) meaning ceil(f * V); `seed` of the internal `numpy.random.Generator`
    (anything `default_rng` takes, e.g. `[seed, step]`)."""

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

    def sample_replacement_ids(self, word_ids: Sequence[int], rng=None) -> np.ndarray:
        """One replacement id per vocabulary id, drawn ∝ M(v) from rank window [k-r, k+r] minus k; -1 where the
        window holds no other word (a one-word vocabulary)."""
        ids = np.asarray(word_ids, dtype=np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.statistics.vocab_size):
            raise ValueError(f"word ids must lie in [0, {self.statistics.vocab_size}), got {word_ids!r}")
        rng = self.rng if rng is None else np.random.default_rng(rng)  # a Generator is returned as is
        return self._draw(self.statistics.rank[ids], np.ones(ids.size, bool), rng)

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
        """The UNA hard negative of each sentence: tokens drawn independently with `replacement_probabilities`
        (exactly one, uniformly, where all scores are equal) are replaced by `sample_replacement_ids`-style draws,
        keeping the text between tokens and each replaced word's capitalisation. `rng` (seed or Generator)
        overrides the internal generator for this call only."""
        if isinstance(sentences, str):
            raise TypeError("augment takes a list of sentences, not a single str")
        sentences, st = list(sentences), self.statistics
        gen = self.rng if rng is None else np.random.default_rng(rng)
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
        spans = [m.span() for ms in matches for m in ms]  # aligned with `ids`
        edits: dict[int, list[tuple[tuple[int, int], int]]] = {}
        for token, new_id in zip(where.tolist(), new_ids.tolist()):
            if new_id >= 0:
                edits.setdefault(int(seg[token]), []).append((spans[token], new_id))
        for sent, changes in edits.items():
            text, pieces, prev, last = sentences[sent], [], 0, ""
            for (start, end), new_id in changes:  # ascending token order
                gap = text[prev:start]
                word = _match_case(st.vocabulary[new_id], text[start:end])
                # Keep token boundaries: a word put in place of "." in "ran." must not fuse
                # with "ran", so the negative re-tokenises into as many tokens as the anchor.
                head = " " if _fuses(gap[-1:] or last, word[0]) else ""
                tail = " " if _fuses(word[-1], text[end:end + 1]) else ""
                pieces += [gap, head, word, tail]
                last, prev = (word + tail)[-1], end
            pieces.append(text[prev:])
            sentences[sent] = "".join(pieces)  # our own copy of the list
        return sentences

    __call__ = augment
