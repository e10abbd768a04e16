#!/usr/bin/env bash
# GPU check of the fused Triton attention (issue 13), at most 8 minutes on one GPU:
#   1. the Triton tests compiled on CUDA (pytest marker "triton"; on CPU they run interpreted),
#   2. `softmaxkit bench attention --device cuda`: the kernels against SDPA's flash backend
#      at bf16, B=4, H=16, D=128, L=8192, causal (GPU_CHECK_FULL=1: every normalizer; default:
#      one per family plus sparsemax and entmax15).
# Budget: tests 290 s (Triton compiles every specialization once), bench 170 s.
# Usage: scripts/gpu-check.sh [python]   (default: .venv/bin/python, else python3)
set -u
cd "$(dirname "$0")/.."
PY="${1:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-check: no CUDA device; nothing to check (the Triton tests run interpreted in 'make test')"
  exit 0
fi
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
status=0
echo "== Triton tests on CUDA =="
timeout 290 "$PY" -m pytest -q -m triton -p no:cacheprovider --timeout=280 tests/kernels/test_triton.py \
  tests/kernels/test_triton_attention.py || status=1
echo "== bench attention --device cuda =="
QUICK="--quick"
if [ "${GPU_CHECK_FULL:-0}" = "1" ]; then QUICK=""; fi
timeout 170 "$PY" -m softmaxkit.cli bench attention --device cuda $QUICK || status=1
exit $status
