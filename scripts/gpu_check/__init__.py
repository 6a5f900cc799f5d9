"""The one-GPU acceptance run (docs/performance.md, section 3): `device.sh` is the device command, `run.py` the
run itself, the other modules its sections (`context`: what they share, `report`: gpu_check.md)."""
