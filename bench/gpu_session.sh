#!/usr/bin/env bash
# The whole GPU session in one call (the device tool runs it from the repo root; see bench/gpu_check.py):
#   bash bench/gpu_session.sh [budget_s [gpu_check args...]]   (carry: tests/sglang_ref, .carry)
#   e.g. bash bench/gpu_session.sh 320 --only build,tests,knockout,headline --knockout
# - .carry/cache: VERIFY_ATTN_CACHE with the sm_90a cubins the model stage reads, built on the CPU machine
#   (python -m bench.gpu_check --prepare-carry); a miss only costs the model stage its time
# - nvidia-smi samples clocks, power and temperature once a second while it runs (the model's clock input)
# - everything lands in $OUT: gpu_check_results.tar.gz, gpu_check.json, gpu_check_stdout.log, smi.csv
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d .carry/cache ] && export VERIFY_ATTN_CACHE="$PWD/.carry/cache"
PYBIN=$(command -v python3 || command -v python)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv || true
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 1000 > /tmp/smi.csv 2>&1 &
SMI=$!
BUDGET=${1:-440}; shift || true
"$PYBIN" -m bench.gpu_check --budget-s "$BUDGET" "$@" 2>&1 | tee /tmp/gpu_check_stdout.log
rc=$?
kill "$SMI" 2>/dev/null
[ -n "${OUT:-}" ] && cp /tmp/gpu_check_stdout.log /tmp/smi.csv "$OUT"/
exit $rc
