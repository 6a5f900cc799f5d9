"""Evaluation of sentence encoders: SentEval STS and transfer tasks, representation diagnostics.

Sub-modules are imported lazily by their users (the trainer imports only `sts` and `encoders`),
so importing this package stays cheap.
"""
