#!/usr/bin/env bash
# One GPU, under 8 minutes: every `gpu`-marked test, then the GPU timings, into one JSON file.
#
#   benchmarks/gpu_check.sh [--out gpu_check.json]   # on a machine with a CUDA GPU
#   benchmarks/gpu_check.sh --dry-run [--out F]      # on a CPU: the gpu tests are collected and the
#                                                    # timing script runs with tiny sizes (no claim)
# PYTHON picks the interpreter (default: the one on PATH). Exit status: 0 when every test passed
# and every timing section ran.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
DRY=0
OUT=gpu_check.json
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--dry-run] [--out FILE]" >&2; exit 2 ;;
  esac
  shift
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ "$DRY" = 1 ]; then
  # every gpu-marked test must at least be collected (an import error in one fails here)
  "$PYTHON" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests > "$WORK/collected.txt"
  n=$(grep -c '::' "$WORK/collected.txt" || true)
  echo "gpu-marked tests collected: $n"
  [ "$n" -gt 0 ] || { cat "$WORK/collected.txt"; echo "no gpu-marked test collected" >&2; exit 1; }
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PYTHON" benchmarks/gpu_timings.py --dry-run --out "$OUT"
  exit $?
fi

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch: use --dry-run")'
export TRITON_INTERPRET=0  # compile the Triton kernels for the GPU (the CPU test suite interprets them)
status=0
timeout 300 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider --junitxml="$WORK/junit.xml" tests || status=$?
timeout 180 "$PYTHON" benchmarks/gpu_timings.py --out "$OUT" --tests-junit "$WORK/junit.xml" || status=$?
exit $status
