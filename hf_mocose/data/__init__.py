"""What training and evaluation read: sentences, batches and the SentEval STS files.

- `corpus`: training sentences from a file, a `datasets` dataset or the built-in offline corpus, tokenised once,
  and `ContrastiveCollator`, their batches (padding, UNA hard negatives, IFCL's fraternal text).
- `sts_files`: readers for the SentEval STS12-16, STS Benchmark and SICK-R files (sentence pairs with gold scores).

May import: nothing else from `hf_mocose` (datasets, transformers' collator, torch, numpy and the standard library).
"""
