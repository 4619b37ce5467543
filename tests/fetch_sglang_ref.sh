#!/usr/bin/env bash
# Fetch SGLang's own Triton tree-verify kernel (two files, ~100 KB) into tests/sglang_ref/
# so tests/test_sglang_compat.py can compare our adapter against it under the Triton
# interpreter, and the source of the interfaces our backend class uses (ForwardBatch,
# AttentionBackend, RadixAttention, the KV pool, the EAGLE verify input), which
# tests/test_sglang_backend.py reads to check the names it relies on. Nothing is committed
# or vendored; without them those tests skip.
set -euo pipefail
cd "$(dirname "$0")"
ver=0.5.23
[ -f sglang_ref/sglang/srt/speculative/eagle_info.py ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m pip download -q "sglang==$ver" --no-deps --only-binary=:all: --python-version 3.11 -d "$tmp"
python - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/sglang-*.whl")[0]
want = ["sglang/kernels/ops/attention/extend_attention.py", "sglang/kernels/ops/attention/score_mod.py",
        "sglang/srt/model_executor/forward_batch_info.py", "sglang/srt/layers/attention/base_attn_backend.py",
        "sglang/srt/layers/attention/triton_backend.py", "sglang/srt/layers/attention/attention_registry.py",
        "sglang/srt/layers/radix_attention.py", "sglang/srt/mem_cache/memory_pool.py",
        "sglang/srt/speculative/eagle_info.py", "sglang/srt/model_executor/model_runner.py"]
with zipfile.ZipFile(whl) as z:
    for name in want:
        z.extract(name, "sglang_ref")
print("fetched", ", ".join(want), "from", whl.rsplit("/", 1)[-1])
PY
