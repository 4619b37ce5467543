#!/usr/bin/env bash
# Fetch SGLang's own Triton tree-verify kernel (two files, ~100 KB) into tests/sglang_ref/
# so tests/test_sglang_compat.py can compare our adapter against it under the Triton
# interpreter. Nothing is committed or vendored; without it that one test skips.
set -euo pipefail
cd "$(dirname "$0")"
ver=0.5.23
[ -f sglang_ref/sglang/kernels/ops/attention/extend_attention.py ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m pip download -q "sglang==$ver" --no-deps --only-binary=:all: --python-version 3.11 -d "$tmp"
python - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/sglang-*.whl")[0]
want = ["sglang/kernels/ops/attention/extend_attention.py", "sglang/kernels/ops/attention/score_mod.py"]
with zipfile.ZipFile(whl) as z:
    for name in want:
        z.extract(name, "sglang_ref")
print("fetched", ", ".join(want), "from", whl.rsplit("/", 1)[-1])
PY
