"""python -m bench.model.split_study: the split heuristic's choices read by the SASS model, against the rule it replaced.

For each device, kernel, context and tree size it prints the split count and the predicted call time of
`verify_attn.config.heuristic_num_splits` (the rule the backends use) beside those of the rule before the
sixteenth session (at least 256 KV tokens a split, whole waves only, no combine term: `old_rule` below), then the
geometric mean of each column and the worst and best ratio. Predictions, not measurements; it reads the cubins of
the real build, like `python -m bench.model` (the first run builds them: minutes on 2 cores).

    python -m bench.model.split_study                                   # H200 and RTX PRO 6000, 2k..185k
    python -m bench.model.split_study --arch sm_90a --ctx 4k,16k --tree 16 --kernel "v3 m64"
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Optional

from verify_attn import config as vc
from verify_attn.shapes import get_shape
from verify_attn.utils import flag_value, parse_ctx, parse_int_list

from . import call as predict, kernels
from .__main__ import _archs, _head_of

# the kernels the study reads when --kernel is not given: the ones a GPU run times (gpu_check's sweep) and the defaults
DEFAULT_KERNELS = {"sm_90a": ("v1 m32 n32 w8 s4 k4 sn2 b1", "v2 m64 n32 w8 s3", "w20", "v3 m64"),
                   "sm_120a": ("v1 m32 n16 w8 s4 k4 sn2", "w20")}


def old_rule(*, batch: int, num_kv_heads: int, m_tiles: int, avg_kv_len: int, num_sms: int, block_n: int) -> int:
    """The split heuristic before the sixteenth session: >= 256 tokens a split (at most floor(len / 256) splits), 1-4
    whole waves, waves x (tiles + 8)."""
    return vc.heuristic_num_splits(batch=batch, num_kv_heads=num_kv_heads, m_tiles=m_tiles, avg_kv_len=avg_kv_len,
                                   num_sms=num_sms, block_n=block_n, min_tiles_per_split=max(1, 256 // block_n),
                                   part_waves=(), combine_tokens_per_group=0, cap_ceil=False)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.model.split_study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90a,sm_120a", help="cubin archs (devices) to read; default both")
    ap.add_argument("--ctx", default="2k,4k,8k,16k,32k,64k,185k", help="prefix lengths (k = 1,000 tokens)")
    ap.add_argument("--tree", default="1,16,64", help="tree node counts")
    ap.add_argument("--shape", default="kimi-k2-tp8", help="head-shape preset")
    ap.add_argument("--kernel", default=None, help="a substring of the kernel name (default: the GPU run's kernels)")
    a = ap.parse_args(argv)
    shape = get_shape(a.shape)
    ctxs = flag_value(parse_ctx, a.ctx, "--ctx")
    trees = parse_int_list(a.tree, "--tree")
    old_t: list[float] = []
    new_t: list[float] = []
    print("predictions from SASS (bench.model), not measurements: splits and us, the old rule -> the heuristic")
    for arch, dev in _archs(a.arch):
        ks = [k for k in kernels.load(arch, _head_of(shape), "bf16", "page1") if k.tile.targets(arch)]
        want = (a.kernel,) if a.kernel else DEFAULT_KERNELS.get(arch, ())
        for km in [k for k in ks if any(w in k.name for w in want)]:
            for ctx in ctxs:
                for n in trees:
                    case = predict.Case(shape, ctx, n, 1, "page1", 1, kv_dtype="bf16")
                    kw = dict(batch=1, num_kv_heads=shape.num_kv_heads, m_tiles=predict.m_tiles(case, km),
                              avg_kv_len=ctx, num_sms=int(dev.sms.value), block_n=km.tile.block_n)
                    # the rule now: what the backends pick (a Hopper v3 tile counts its pairs: tile_split_args)
                    so, sn = old_rule(**kw), predict.default_splits(case, km, dev)
                    po, pn = predict.predict(km, dev, case, so), predict.predict(km, dev, case, sn)
                    old_t.append(po.total_us)
                    new_t.append(pn.total_us)
                    print(f"{dev.key:12} {km.name:70} {ctx:>7} {n:>3}  {so:>4}: {po.total_us:7.1f} -> "
                          f"{sn:>4}: {pn.total_us:7.1f}  ({pn.total_us / po.total_us - 1:+.1%})", flush=True)
    if not old_t:
        print("no kernel matched", file=sys.stderr)
        return 2
    gm = [math.exp(sum(map(math.log, t)) / len(t)) for t in (old_t, new_t)]
    ratios = [b / a for a, b in zip(old_t, new_t)]
    print(f"geometric mean {gm[0]:.1f} -> {gm[1]:.1f} us over {len(old_t)} rows; "
          f"ratio worst {max(ratios):.3f}, best {min(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
