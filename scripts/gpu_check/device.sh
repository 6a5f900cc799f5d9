#!/usr/bin/env bash
# The device command of the one-GPU acceptance run (docs/performance.md, "One-GPU acceptance run"):
#
#   bash scripts/gpu_check/device.sh [run.py options]       e.g. nothing, or --tiny --device cpu
#
# Installs the wheels in $GPU_CHECK_WHEELS (default .whl, the folder `carry` brings; none: nothing to install)
# into $GPU_CHECK_SITE (default /tmp/site), puts that folder and this repository on PYTHONPATH, prints the GPU and the versions, then runs
# scripts/gpu_check/run.py under `timeout` ($GPU_CHECK_TIMEOUT seconds, default 540: its own budget is 465 s) and
# writes gpu_check.json, gpu_check.md and gpu_check.log into $GPU_CHECK_OUTPUT (default $OUT/gpu_check).
# Its exit status is run.py's (124: the timeout stopped it; the JSON then holds the sections done).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO="$PWD"
OUTPUT="${GPU_CHECK_OUTPUT:-${OUT:?set OUT (the device tool does) or GPU_CHECK_OUTPUT}/gpu_check}"
WHEELS="${GPU_CHECK_WHEELS:-.whl}"
SITE_DIR="${GPU_CHECK_SITE:-/tmp/site}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUTPUT"
SITE=""
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE_DIR" \
        "$WHEELS"/*.whl || { echo "gpu_check/device.sh: installing the wheels of $WHEELS failed" >&2; exit 3; }
    SITE="$SITE_DIR:"
fi
export PYTHONPATH="$SITE$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PYTHON" -c "import sys, torch, transformers, sentence_transformers, accelerate, datasets, huggingface_hub
print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda,
      torch.cuda.is_available(), '| transformers', transformers.__version__, '| sentence-transformers',
      sentence_transformers.__version__, '| accelerate', accelerate.__version__, '| datasets', datasets.__version__,
      '| huggingface_hub', huggingface_hub.__version__)"
    timeout --kill-after=15 "${GPU_CHECK_TIMEOUT:-540}" "$PYTHON" scripts/gpu_check/run.py --output_dir "$OUTPUT" "$@"
} 2>&1 | tee "$OUTPUT/gpu_check.log"
