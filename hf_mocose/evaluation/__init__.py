"""Evaluation of sentence encoders: SentEval STS and transfer tasks, representation diagnostics.

- `sts` (STS tasks, and the diagnostics on STS-B: alignment, uniformity, singular-value spectrum), `transfer`
  (SentEval's classification tasks), `runner` (any encoder as a `SentenceTransformer`, tasks by name, one results
  table), `commands` (`hf-mocose evaluate` and `hf-mocose diagnose`).

Sub-modules are imported lazily by their users, so importing this package stays cheap. May import:
`hf_mocose.models`, `augmentation`, `data`, `metrics`. The core never imports it.
"""
