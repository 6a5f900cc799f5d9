"""Evaluation of sentence encoders: SentEval STS and transfer tasks, representation diagnostics.

- `sts` (STS12-16, STS-B, SICK-R and the papers' aggregations; the diagnostics on STS-B: alignment,
  uniformity, the singular-value spectrum), `transfer` (SentEval's classification tasks), `runner` (the
  encoder: MoCoSE checkpoints, sentence-transformers folders and plain encoders as one `SentenceTransformer`;
  tasks by name; one results table), `commands` (`hf-mocose evaluate` and `hf-mocose diagnose`).

Sub-modules are imported lazily by their users, so importing this package stays cheap.

May import: `hf_mocose.models`, `methods`, `data`, `metrics`. The core never imports it.
"""
