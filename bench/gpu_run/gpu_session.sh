#!/usr/bin/env bash
# The whole GPU session in one call (the device tool runs it from the repo root; see bench/gpu_run/gpu_check.py):
#   bash bench/gpu_session.sh [budget_s [gpu_check args...]]   (carry: tests/sglang_ref, .carry)
#   e.g. bash bench/gpu_session.sh 320 --only build,tests,knockout,headline --knockout
# - .carry/cache: VERIFY_ATTN_CACHE with the sm_90a cubins the model stage reads, built on the CPU machine
#   (python -m bench.gpu_check --prepare-carry); a miss only costs the model stage its time
# - .carry/peers: the peer kernels (FA3 MLA, FlashMLA dense decode, FlashInfer's MLA modules) built on the CPU
#   machine against the device's torch by the team's shared/tools/peers/build_peers.sh, staged with
#   `python -m bench.peer_bundle --stage <its OUT>` (~33 MB; the whole carry stays under 64 MiB). Set up as its README
#   says: FlashInfer unzipped to /tmp/fi, its small wheels installed offline, the bundle on PYTHONPATH
#   (bench/benchmark/peer_bundle.py finds it through VERIFY_ATTN_PEERS). Absent: the peers stages' rows say why.
# - nvidia-smi samples clocks, power and temperature once a second while it runs (the model's clock input)
# - everything lands in $OUT: gpu_check_results.tar.gz, gpu_check.json, gpu_check_stdout.log, smi.csv
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d .carry/cache ] && export VERIFY_ATTN_CACHE="$PWD/.carry/cache"
PYBIN=$(command -v python3 || command -v python)
if [ -d .carry/peers ]; then
  B="$PWD/.carry/peers"
  export VERIFY_ATTN_PEERS="$B" FLASHINFER_DISABLE_JIT=1
  PEER_PATH="$B:$B/fa3"
  FI=${PEERS_FI_DIR:-/tmp/fi}   # FlashInfer's data files and modules cannot load from inside a zip
  if [ -f "$B/flashinfer_trim.zip" ] && rm -rf "$FI" && "$PYBIN" -m zipfile -e "$B/flashinfer_trim.zip" "$FI"; then
    PEER_PATH="$PEER_PATH:$FI"
  fi
  if ls "$B"/wheels/*.whl >/dev/null 2>&1; then
    "$PYBIN" -m pip install -q --no-deps --no-index "$B"/wheels/*.whl || echo "peers: the bundle's wheels did not install"
  fi
  export PYTHONPATH="$PEER_PATH${PYTHONPATH:+:$PYTHONPATH}"
  echo "peers: bundle $B ($(du -sh "$B" | cut -f1)); PYTHONPATH=$PYTHONPATH"
fi
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
