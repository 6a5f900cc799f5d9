#!/usr/bin/env bash
# The one-GPU acceptance check, as a GPU node runs it (docs/performance.md, "One-GPU acceptance check"):
#
#   bash scripts/gpu_check/device.sh [run.py options]       e.g. nothing, or --tiny --device cpu
#
# Installs the wheels in $GPU_CHECK_WHEELS (default .gpu_bundle/wheels, written by
# scripts/gpu_check/bundle.py for an air-gapped node; none there: nothing to install) into $GPU_CHECK_SITE (default /tmp/site), pip's output
# going to the log only; puts that folder and this repository on PYTHONPATH, prints the GPU, then runs
# scripts/gpu_check/run.py under `timeout` ($GPU_CHECK_TIMEOUT seconds, default 540: its own budget is 465 s) and
# writes gpu_check.json, gpu_check.md, gpu_check.log and quickstart.log into $GPU_CHECK_OUTPUT (default
# outputs/gpu_check). run.py checks the packages before any work: when one is missing it writes the report with the
# failure in it and ends the output with one line naming the missing packages, their wheels and the bundle.
# The exit status is run.py's (0: every selected check ran and passed; 1: something failed; 2: nothing failed, but some
# check or section ran out of time; 3: a package is missing or datasets cannot read data; 124: the timeout stopped it,
# and the JSON holds the sections done). `--sections NAME ...` reruns only those (the JSON's `rerun` names them).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO="$PWD"
OUTPUT="${GPU_CHECK_OUTPUT:-outputs/gpu_check}"
WHEELS="${GPU_CHECK_WHEELS:-.gpu_bundle/wheels}"
SITE_DIR="${GPU_CHECK_SITE:-/tmp/site}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUTPUT"
LOG="$OUTPUT/gpu_check.log"
: >"$LOG"
SITE=""
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE_DIR" \
        "$WHEELS"/*.whl >>"$LOG" 2>&1; then
        STATUS="installed $(compgen -G "$WHEELS/*.whl" | wc -l) from $WHEELS"
        SITE="$SITE_DIR:"
    else
        STATUS="pip could not install those in $WHEELS (its output is in gpu_check.log)"
    fi
else
    STATUS="none in $WHEELS"
fi
export GPU_CHECK_WHEELS_STATUS="$STATUS"  # run.py records it, and names it when a package is missing
export PYTHONPATH="$SITE$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    fi
    timeout --kill-after=15 "${GPU_CHECK_TIMEOUT:-540}" "$PYTHON" scripts/gpu_check/run.py --output_dir "$OUTPUT" "$@"
} 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
