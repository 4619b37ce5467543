"""--alloc in the benchmark (issue 15 item 6): the same logical KV in three placements gives the same
reference output; contiguous ids are consecutive, fragmented ones come in runs, shuffled ones do not;
bench.verify records the policy in the payload and in every row."""
from __future__ import annotations

import pytest
import torch

from bench.core.inputs import make_inputs, make_trees
from bench.benchmark.verify import build_parser, sweep
from verify_attn import tree_verify
from verify_attn.shapes import get_shape


def consecutive(ids: torch.Tensor) -> float:
    return float((ids[1:] - ids[:-1] == 1).double().mean())


@pytest.mark.parametrize("page_size", [1, 16])
def test_alloc_modes_same_output_different_placement(page_size: int) -> None:
    shape = get_shape("kimi-k2-tp8")
    trees = make_trees(5, "ddtree", 1)
    outs, runs = {}, {}
    for alloc in ("shuffled", "contiguous", "fragmented"):
        kw = make_inputs(shape, 700, trees, page_size, torch.float32, "cpu", seed=0, alloc=alloc)
        outs[alloc] = tree_verify(**kw, backend="reference")
        runs[alloc] = consecutive(kw["kv_indices"])
    torch.testing.assert_close(outs["contiguous"], outs["shuffled"])
    torch.testing.assert_close(outs["fragmented"], outs["shuffled"])
    assert runs["contiguous"] == 1.0 and runs["shuffled"] < 0.1
    if page_size == 1:                        # 705 slots: a few runs of 8..256
        assert 0.9 < runs["fragmented"] < 1.0
    with pytest.raises(ValueError, match="--alloc"):
        make_inputs(shape, 10, trees, 1, torch.float32, "cpu", seed=0, alloc="sorted")


def test_bench_verify_records_alloc() -> None:
    a = build_parser().parse_args(["--ctx", "64", "--tree", "4", "--alloc", "contiguous", "--no-save", "--quiet",
                                   "--no-model"])
    payload = sweep(a)
    assert payload["alloc"] == "contiguous"
    assert payload["results"] and all(r["alloc"] == "contiguous" for r in payload["results"])
