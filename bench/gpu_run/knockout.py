"""python -m bench.knockout: where a split kernel's time goes, measured by leaving one part out.

Without hardware counters for every question, the way to place time inside one kernel is
to time variants that skip one stage and take differences (the device notes' advice). The
kernels compile with `-DVA_TV_KNOCKOUT=bits` (csrc/tree_verify/request.cuh):

    1  no KV copies in the main loop (the stages keep stale rows: the compute alone)
    2  no kv_indices loads in the main loop (row id = token position, page_size 1)
    4  no partial-score exchange between kernel v2's warpgroups
    8  no L2 prefetches in kernel v2 (its result stays right: the prefetch's A/B)

Each variant is its own JIT module (VERIFY_ATTN_KNOCKOUT; the shipped module is untouched),
built in parallel first. Every pinned kernel version is timed on the same inputs (cold L2,
CUDA graph, median); the unmodified build (bits 0) is checked against the float64 reference,
the others are wrong by design and only timed. The table gives each variant's time and its
difference to the full kernel: the share of the tile that part holds on the critical path.

    python -m bench.knockout --ctx 185k --tree 16 --variants 0,1,2,4,7,8 --versions v2,v1 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
STEM = "mla576_bf16_page1"
NAMES = {0: "full kernel", 1: "no KV copies", 2: "no index loads", 3: "no copies, no index", 4: "no exchange (v2)",
         5: "no copies, no exchange", 6: "no index, no exchange", 7: "compute only", 8: "no L2 prefetch (v2)",
         16: "half the rows (v3 cluster)"}


def _env(bits: int) -> dict:
    env = {**os.environ, "VERIFY_ATTN_JIT_SET": STEM}
    env.pop("VERIFY_ATTN_JIT_ALL", None)
    if bits:
        env["VERIFY_ATTN_KNOCKOUT"] = str(bits)
    else:
        env.pop("VERIFY_ATTN_KNOCKOUT", None)
    return env


def build(variants: list[int], timeout: float = 300) -> dict[int, str]:
    """Build every variant's module in parallel subprocesses: {bits: 'ok' | why not}."""
    code = "from verify_attn.backends.cuda import load_ops; load_ops('bf16', 'mla576', 'page1')"
    procs = {b: subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env(b), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for b in variants}
    out = {}
    t0 = time.perf_counter()
    for b, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            out[b] = "ok" if p.returncode == 0 else f"build failed: {text[-1500:]}"
        except subprocess.TimeoutExpired:
            p.kill()
            out[b] = "build timed out"
    print(f"[knockout] built {len(variants)} variants in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{b}: {s[:40]}" for b, s in out.items()), flush=True)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.knockout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", default="185k", help="prefix tokens (default 185k)")
    ap.add_argument("--tree", default="16", help="tree nodes, comma-separated (default 16)")
    ap.add_argument("--variants", default="0,1,2,4,7,8", help="knockout bits to build and time (0 = the full kernel)")
    ap.add_argument("--versions", default="v2,v1", help="pinned kernel versions to time")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    from verify_attn.tree import check_tree_sizes
    from verify_attn.utils import dash_values, parse_int_list, parse_tokens, usage_error
    a = dash_values(ap).parse_args(argv)
    import torch
    err = lambda msg: usage_error(f"{ap.prog}: error: {msg}")   # one line, no usage block
    try:
        variants = sorted({int(x) for x in a.variants.split(",") if x.strip()})
    except ValueError:
        variants = []
    if not variants or any(b not in NAMES for b in variants):
        raise err(f"--variants: knockout bits {', '.join(map(str, NAMES))}, comma-separated, got {a.variants!r}")
    versions = [v.strip() for v in a.versions.split(",") if v.strip()]
    try:
        trees = parse_int_list(a.tree, "--tree")
        try:
            ctx = parse_tokens(a.ctx)
        except ValueError as e:
            raise ValueError(f"--ctx: {e}") from None
    except ValueError as e:
        raise err(e) from None
    try:
        check_tree_sizes(trees)
    except ValueError as e:
        raise err(e) from None
    if a.reps < 1:
        raise err(f"--reps must be >= 1, got {a.reps}")
    if a.json and not Path(a.json).resolve().parent.is_dir():
        raise err(f"--json {a.json}: the folder {Path(a.json).resolve().parent} does not exist")
    if not torch.cuda.is_available():
        print("bench.knockout: no CUDA device; it times kernels, nothing to do here", file=sys.stderr)
        return 2
    built = build(variants)

    from bench.core.inputs import make_inputs, make_trees
    from bench.core.measure import compare, problem_of
    from bench.core.timing import rotation_sets, time_cuda
    from verify_attn import device as vdevice
    from verify_attn.backends import cuda as vcuda
    from verify_attn.backends import get_backend
    from verify_attn.reference import reference_verify
    from verify_attn.shapes import get_shape

    shape = get_shape("kimi-k2-tp8")
    b = get_backend("cuda")
    l2 = vdevice.query(torch.cuda.current_device()).l2_bytes
    rows = []
    for nodes in trees:
        tr = make_trees(nodes, "ddtree", 1)
        first = make_inputs(shape, ctx, tr, 1, torch.bfloat16, "cuda", seed=0)
        set_bytes = sum(t.numel() * t.element_size() for t in first.values() if isinstance(t, torch.Tensor))
        sets = [first] + [make_inputs(shape, ctx, tr, 1, torch.bfloat16, "cuda", seed=s)
                          for s in range(1, rotation_sets(set_bytes, l2))]
        probs = [problem_of(kw) for kw in sets]
        ref = reference_verify(probs[0])[0]
        out_shape = (sets[0]["q"].shape[0], shape.num_q_heads, shape.head_dim_v)
        outs = [torch.empty(out_shape, dtype=torch.bfloat16, device="cuda") for _ in sets]
        for v in versions:
            cfg = vcuda.version_config(probs[0], v)
            full = None
            for bits in variants:
                row = {"ctx": ctx, "tree_nodes": nodes, "version": v, "knockout": bits, "what": NAMES[bits],
                       "config": cfg.to_dict()}
                if built.get(bits) != "ok":
                    row["status"] = built.get(bits, "not built")
                    rows.append(row)
                    continue
                os.environ.update(_env(bits))
                if not bits:
                    os.environ.pop("VERIFY_ATTN_KNOCKOUT", None)
                try:
                    fns = [lambda p=p, o=o: b.run(p, cfg, o, None) for p, o in zip(probs, outs)]
                    if bits == 0:
                        outs[0].fill_(float("nan"))
                        fns[0]()
                        torch.cuda.synchronize()
                        ok, rel, _abs, why = compare(outs[0], ref, torch.bfloat16)
                        row["max_rel_err"] = rel
                        if not ok:
                            row["status"] = f"wrong: {why}"
                            rows.append(row)
                            continue
                    t = time_cuda(fns, l2_cold=True, reps=a.reps, warmup=2, max_seconds=3.0)
                    row.update(status="ok", median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us)
                    if bits == 0:
                        full = t.median_us
                    if full:
                        row["saved_us"] = full - t.median_us
                except Exception as e:  # recorded, the next variant runs
                    row["status"] = f"error: {type(e).__name__}: {e}"[:300]
                rows.append(row)
        del sets, probs, outs
        torch.cuda.empty_cache()
    os.environ.pop("VERIFY_ATTN_KNOCKOUT", None)
    print(f"\nknockouts on {torch.cuda.get_device_name()} (us per call, median, cold L2, CUDA graph):")
    print(f"{'ver':4} {'T':>3} {'bits':>4} {'what':24} {'median':>9} {'saved':>8}  status")
    for r in rows:
        med = f"{r['median_us']:9.1f}" if r.get("median_us") else f"{'-':>9}"
        saved = f"{r['saved_us']:8.1f}" if r.get("saved_us") is not None and r["knockout"] else f"{'':>8}"
        print(f"{r['version']:4} {r['tree_nodes']:>3} {r['knockout']:>4} {r['what']:24} {med} {saved}  {r['status']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
