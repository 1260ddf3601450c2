#!/usr/bin/env bash
# dplan on one real GPU, as one prepared command (docs/gpu-check.md):
#   scripts/gpu-check.sh --bundle             here: gather the headers the GPU machine lacks into
#                                             .gpu-bundle/, check the limits, print the call to make
#   scripts/gpu-check.sh --out DIR            on the GPU machine (DIR defaults to $OUT): build, probe,
#                                             train, checkpoint, NCCL, calibrate; DIR/summary.json
#   scripts/gpu-check.sh --dry-run --out DIR  here, without a GPU: the bundle, the same build against
#                                             scripts/torch-venv.sh's CUDA PyTorch, every step (the
#                                             GPU steps must refuse in one line)
# Options: --python PY (the PyTorch with CUDA to build against; default python3, the dry run
# scripts/torch-venv.sh's). The steps live in scripts/gpu_check.py (standard library only).
set -euo pipefail
exec "${PYTHON_FOR_SCRIPTS:-python3}" "$(dirname "$0")/gpu_check.py" "$@"
