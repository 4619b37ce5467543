#!/usr/bin/env bash
# GPU checks of the integration loop, written on a CPU-only machine and NOT yet run on a GPU.
# Runs in a few minutes on one H200; results (JSON, PNG) go under $OUT (default bench/results).
#   bash integration/gpu_check.sh
# --check compares with plain greedy decoding on the float64 reference backend token for token (fp32) and bounds
# every verify's logits against it; 16-bit runs may flip a near-tie, reported as such.
set -u
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
run() { echo "+ $*"; timeout 300 "$@" 2>&1 | tail -20; echo "rc=${PIPESTATUS[0]}"; }
nvidia-smi --query-gpu=name --format=csv,noheader
run python -m integration.decode --model small-k2 --device cuda --dtype float32 --attn-backend triton \
    --ctx 8k --steps 8 --check
run python -m integration.decode --model small-k2 --device cuda --dtype float16 --attn-backend cuda \
    --layout paged --page-size 64 --ctx 8k --steps 8 --check
run python -m integration.decode --model small-k2 --device cuda --dtype float32 --attn-backend triton \
    --ctx 8k --steps 8 --budget auto --check
run python -m integration.probe --model small-k2 --device cuda --dtype float32 --short 1k --long 64k --steps 4 \
    --attn-backend triton,triton-serial
run python -m integration.probe --model small-k2 --device cuda --dtype float32 --short 1k --long 64k --steps 4 \
    --drafter real --attn-backend triton
# bytes per part, measured as time on the GPU: the draft part's growth per 1k tokens against verify_attn's
run python -m integration.bench_e2e --model kimi-k2-tp8 --simulate-rank --layers 8 --ctx 1.4k,32k,128k \
    --steps 4 --warmup 1 --simulate-accept-len 4 --tree chain --alloc contiguous --json "$OUT/e2e-gpu-layers8.json"
run python -m integration.bench_e2e --model kimi-k2-tp8 --simulate-rank --layers 8 --ctx 1.4k,32k,128k \
    --steps 4 --warmup 1 --simulate-accept-len 4 --tree chain --alloc shuffled --json "$OUT/e2e-gpu-layers8-shuffled.json"
