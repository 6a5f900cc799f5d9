"""The one-GPU acceptance check (docs/performance.md, "One-GPU acceptance check"): `device.sh` is the command a GPU node runs, `run.py` the
run itself, the other modules its sections (`context`: what they share, `report`: gpu_check.md)."""
