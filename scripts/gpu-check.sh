#!/usr/bin/env bash
# GPU check, at most 8 minutes on one GPU:
#   1. the Triton tests compiled on CUDA (pytest marker "triton"; on CPU they run interpreted) and the
#      CUDA tests (marker "cuda"; skipped on CPU), in parallel processes where pytest-xdist is
#      installed (Triton compiles each specialization once),
#   2. `softmaxkit bench dispatch --device cuda`: sk.softmax / log_softmax / logsumexp (auto) against
#      torch and the Triton kernels on the dispatch grid, float32 and bfloat16,
#   3. `softmaxkit bench attention --device cuda`: the fused kernels against SDPA's flash backend
#      at bf16, B=4, H=16, D=128, L=8192, causal (GPU_CHECK_FULL=1: every normalizer, and the
#      full grids; default: one per family plus sparsemax and entmax15).
# Budget: tests 200 s, dispatch 120 s, attention 110 s. A log goes to $OUT/gpu-check.log when OUT is set.
# GPU_CHECK_BENCHES="dispatch" (say) runs only the benches named (default: "dispatch attention").
# Usage: scripts/gpu-check.sh [python]   (default: .venv/bin/python, else python3)
set -u
cd "$(dirname "$0")/.."
PY="${1:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/gpu-check.log") 2>&1; fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-check: no CUDA device; nothing to check (the Triton tests run interpreted in 'make test')"
  exit 0
fi
"$PY" -c "import torch, triton; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__, 'triton', triton.__version__)"
status=0
PARALLEL=""
if "$PY" -c "import xdist" 2>/dev/null; then PARALLEL="-n 8"; fi
echo "== Triton tests on CUDA =="
timeout 200 "$PY" -m pytest -q -m "triton or cuda" -p no:cacheprovider $PARALLEL --timeout=190 -rfE \
  tests/kernels/test_triton.py tests/kernels/test_triton_attention.py tests/kernels/test_cuda_dispatch.py || status=1
QUICK="--quick"
if [ "${GPU_CHECK_FULL:-0}" = "1" ]; then QUICK=""; fi
for bench in ${GPU_CHECK_BENCHES:-dispatch attention}; do
  echo "== bench $bench --device cuda =="
  case $bench in
    dispatch) timeout 120 "$PY" -m softmaxkit.cli bench dispatch --device cuda || status=1 ;;
    attention) timeout 110 "$PY" -m softmaxkit.cli bench attention --device cuda $QUICK || status=1 ;;
    *) echo "gpu-check: unknown bench $bench"; status=1 ;;
  esac
done
exit $status
