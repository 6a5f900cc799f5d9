"""UNA's corpus statistics: tokenisation, TF-IDF scores per word, and their on-disk cache.

`UNAStatistics` holds, per vocabulary word, its idf and its largest tf-idf score over the corpus
(one document per sentence), in O(V) arrays; `UNAStatistics.from_corpus` builds them once and
caches them keyed by a fingerprint of the corpus. The sampling that uses them is `hf_mocose.methods.una`
(`UNAAugmenter`); see `docs/una.md` for the formulas.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["TOKEN_PATTERN", "TOKEN_RE", "tokenize", "corpus_fingerprint", "UNAStatistics"]

logger = logging.getLogger(__name__)

#: Word runs or single non-space symbols; each match is lowercased to give a token.
TOKEN_PATTERN = r"\w+|[^\w\s]"
TOKEN_RE = re.compile(TOKEN_PATTERN)
# Bumped whenever tokenisation or the statistics change, so old caches are rebuilt.
_FORMAT_VERSION = 1
_STATS_FILE = "una_stats.npz"
_VOCAB_FILE = "una_vocab.json"


def tokenize(sentence: str) -> list[str]:
    """Splits `sentence` with `TOKEN_PATTERN` and lowercases each token.

    Matching runs on the original text (not on `sentence.lower()`) so the same spans can be
    used to rebuild the sentence in `UNAAugmenter.augment`; for ordinary text the two agree.
    """
    return [t.lower() for t in TOKEN_RE.findall(sentence)]


def corpus_fingerprint(sentences: Iterable[str]) -> str:
    """sha256 of the sentences (length-prefixed, so boundaries matter) and the format version."""
    digest = hashlib.sha256(f"una-v{_FORMAT_VERSION}|{TOKEN_PATTERN}|".encode())
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"corpus sentence {i} is a {type(sentence).__name__}, not a str")
        data = sentence.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


class UNAStatistics:
    """Corpus TF-IDF statistics for UNA, all O(V) arrays indexed by vocabulary id.

    Attributes:
        vocabulary: words by id (first-appearance order in the corpus).
        idf: ln(N / df(w)).
        max_score: M(w), the largest tf-idf score of w over the corpus.
        n_documents: N, the number of sentences (empty ones included).
        fingerprint: `corpus_fingerprint` of the corpus, or None.
        order / rank: ids sorted by ascending M (ties by id) and each id's position there.
        cumulative: `[0, cumsum(M[order])]`, so the M-mass of a rank window is two lookups.
    """

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
        arrays = (self.idf, self.max_score, self.order, self.rank, self.sorted_max_score, self.cumulative)
        return sum(a.nbytes for a in arrays)

    @classmethod
    def build(cls, sentences: Iterable[str]) -> "UNAStatistics":
        """Computes the statistics of `sentences` (one document each) through a CSR count matrix."""
        sentences = list(sentences)
        return cls._build(sentences, corpus_fingerprint(sentences))

    @classmethod
    def _build(cls, sentences: list[str], fingerprint: str) -> "UNAStatistics":
        n_docs = len(sentences)
        if n_docs == 0:
            raise ValueError("UNA needs a non-empty corpus, got 0 sentences")
        word_to_id: dict[str, int] = {}
        assign = word_to_id.setdefault
        ids: list[int] = []
        lengths = np.empty(n_docs, dtype=np.int64)
        for d, sentence in enumerate(sentences):  # str-checked by corpus_fingerprint
            tokens = tokenize(sentence)
            ids.extend([assign(t, len(word_to_id)) for t in tokens])
            lengths[d] = len(tokens)
        size = len(word_to_id)
        if size == 0:
            raise ValueError(f"UNA corpus of {n_docs} sentences has no tokens")
        cols = np.fromiter(ids, dtype=np.int64, count=len(ids))
        rows = np.repeat(np.arange(n_docs), lengths)
        counts = sp.csr_matrix((np.ones(cols.size, np.int32), (rows, cols)), shape=(n_docs, size))
        counts.sum_duplicates()  # one entry per (sentence, word) holding count(w, s)
        df = np.bincount(counts.indices, minlength=size)
        idf = np.log(n_docs / df)
        entry_rows = np.repeat(np.arange(n_docs), np.diff(counts.indptr))
        scores = np.log1p(counts.data / lengths[entry_rows]) * idf[counts.indices]
        # Per-word maximum: group the entries by column (every word has df >= 1, so no empty group).
        by_word = np.argsort(counts.indices, kind="stable")
        starts = np.concatenate(([0], np.cumsum(df)[:-1]))
        max_score = np.maximum.reduceat(scores[by_word], starts)
        return cls(list(word_to_id), idf, max_score, n_docs, fingerprint)

    @classmethod
    def from_corpus(cls, sentences: Iterable[str], cache_dir: str | os.PathLike | None = None) -> "UNAStatistics":
        """Builds the statistics, or loads them from `cache_dir` when its fingerprint matches.

        A missing, unreadable or stale cache is (re)built and written back to `cache_dir`.
        """
        sentences = list(sentences)
        fingerprint = corpus_fingerprint(sentences)
        if cache_dir is not None:
            try:
                cached = cls.load(cache_dir)
            except FileNotFoundError:
                cached = None
            except (OSError, ValueError, KeyError, TypeError) as err:
                logger.warning("Ignoring unreadable UNA cache in %s: %s", cache_dir, err)
                cached = None
            if cached is not None and cached.fingerprint == fingerprint:
                return cached
        stats = cls._build(sentences, fingerprint)
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
        with open(directory / _VOCAB_FILE, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("format_version") != _FORMAT_VERSION or meta.get("token_pattern") != TOKEN_PATTERN:
            raise ValueError(f"UNA cache in {directory} has another format or tokeniser")
        with np.load(directory / _STATS_FILE, allow_pickle=False) as arrays:
            idf, max_score = arrays["idf"], arrays["max_score"]
            npz_fingerprint = str(arrays["fingerprint"])
        if npz_fingerprint != (meta["fingerprint"] or ""):
            raise ValueError(f"UNA cache files in {directory} come from different corpora")
        return cls(meta["vocabulary"], idf, max_score, meta["n_documents"], meta["fingerprint"])

    def score_tokens(self, tokens: Sequence[str]) -> np.ndarray:
        """tf-idf score of each token of one tokenised sentence (OOV words: idf = ln N, as if df = 1)."""
        _, scores, _ = self.score_batch([list(tokens)])
        return scores

    def score_batch(self, token_lists: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat `(ids, scores, sentence_of_token)` for a batch of tokenised sentences, all of shape
        `(total tokens,)`: vocabulary id (-1 for OOV words), tf-idf score, index of the sentence."""
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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
