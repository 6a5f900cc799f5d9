"""Benchmarks (docs/performance.md): `benchmark_*.py` are the commands; `train_variants` builds the trainers they
(and gpu_check) time, `turn_taking` lets them take turns step by step, `quality_tables` makes the quality tables."""
