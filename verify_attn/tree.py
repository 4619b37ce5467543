"""Draft trees: parent arrays, depths, packed ancestor masks, batching, SGLang masks.

A tree of T nodes is a parent list: `parents[0] == -1` (node 0 is the root, the
last committed token) and `0 <= parents[i] < i` for i > 0, so a parent always
precedes its child. Node i sees tree node j iff j is an ancestor of i or i
itself. The packed mask stores that as bit (j % 32) of int32 word j // 32 in
row i (the sign bit is bit 31).
"""
from __future__ import annotations

from typing import Sequence

import torch

TREE_KINDS = ("chain", "bushy", "star", "deep")
MAX_CHECKED_NODES = 256  # the largest tree the kernels are checked at (tests/test_cuda_emu.py): the CLIs' limit


def check_tree_sizes(nodes: Sequence[int], flag: str = "--tree") -> None:
    """The CLIs' one tree-size limit: ValueError naming `flag` and MAX_CHECKED_NODES for a larger tree."""
    if nodes and max(nodes) > MAX_CHECKED_NODES:
        raise ValueError(f"{flag} {max(nodes)}: at most {MAX_CHECKED_NODES} nodes per request (the largest tree "
                         "the kernels are checked at)")


def validate_parents(parents: Sequence[int], name: str = "parents") -> None:
    if len(parents) < 1:
        raise ValueError(f"{name} must have at least one node (the root)")
    if parents[0] != -1:
        raise ValueError(f"{name}[0] must be -1 (node 0 is the root), got {parents[0]}")
    for i in range(1, len(parents)):
        p = parents[i]
        if not isinstance(p, int) or isinstance(p, bool):
            raise TypeError(f"{name}[{i}] must be an int, got {type(p).__name__}")
        if not 0 <= p < i:
            raise ValueError(f"{name}[{i}] = {p}: a parent must precede its child (0 <= parent < {i})")


def depths(parents: Sequence[int]) -> list[int]:
    validate_parents(parents)
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def positions(parents: Sequence[int], prefix_len: int) -> list[int]:
    """Position of each node: prefix_len + depth (the root sits at prefix_len)."""
    return [prefix_len + x for x in depths(parents)]


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """bool [T, T]: m[i, j] iff j is an ancestor of i or i itself."""
    validate_parents(parents)
    t = len(parents)
    m = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        m[i, i] = True
        if i:
            m[i] |= m[parents[i]]
    return m


def num_words(t: int) -> int:
    return max(1, (t + 31) // 32)


def pack_mask(dense: torch.Tensor, words: int | None = None) -> torch.Tensor:
    """bool [T, T'] -> int32 [T, W], bit (j % 32) of word j // 32."""
    if dense.dim() != 2 or dense.dtype != torch.bool:
        raise ValueError(f"dense mask must be a 2-D bool tensor, got {dense.dtype} {tuple(dense.shape)}")
    rows, cols = dense.shape
    w = num_words(cols) if words is None else words
    if w * 32 < cols:
        raise ValueError(f"words={w} cannot hold {cols} columns")
    padded = torch.zeros(rows, w * 32, dtype=torch.int64)
    padded[:, :cols] = dense.to(torch.int64)
    shifts = torch.arange(32, dtype=torch.int64)
    packed = (padded.view(rows, w, 32) << shifts).sum(-1)                     # [rows, W] in [0, 2^32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_mask(packed: torch.Tensor, t: int) -> torch.Tensor:
    """int32 [T, W] -> bool [T, t]."""
    if packed.dim() != 2:
        raise ValueError(f"packed mask must be 2-D, got shape {tuple(packed.shape)}")
    if packed.shape[1] * 32 < t:
        raise ValueError(f"packed mask has {packed.shape[1]} words, too few for {t} columns")
    j = torch.arange(t)
    words = packed.to(torch.int64)[:, j // 32] & 0xFFFFFFFF
    return ((words >> (j % 32)) & 1).bool()


def pack_batch(trees: Sequence[Sequence[int]], words: int | None = None,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Parent lists of B requests -> (qo_indptr int32 [B+1], tree_mask int32 [sum T_b, W])."""
    if len(trees) < 1:
        raise ValueError("pack_batch needs at least one tree")
    maxt = max(len(t) for t in trees)
    w = num_words(maxt) if words is None else words
    if w * 32 < maxt:
        raise ValueError(f"words={w} cannot hold trees of {maxt} nodes")
    masks = [pack_mask(ancestor_mask(p), w) for p in trees]
    indptr = [0]
    for p in trees:
        indptr.append(indptr[-1] + len(p))
    return (torch.tensor(indptr, dtype=torch.int32, device=device), torch.cat(masks).to(device))


def random_parents(t: int, kind: str = "bushy", generator: torch.Generator | None = None) -> list[int]:
    """A random tree of `t` nodes. chain: a path; star: all children of the root;
    bushy: each node picks a random earlier parent, biased to recent nodes (DDTree-like);
    deep: mostly a path with occasional branches."""
    if t < 1:
        raise ValueError(f"tree size must be >= 1, got {t}")
    if kind not in TREE_KINDS:
        raise ValueError(f"unknown tree kind {kind!r}; known: {', '.join(TREE_KINDS)}")
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    parents = [-1]
    for i in range(1, t):
        if kind == "chain":
            parents.append(i - 1)
        elif kind == "star":
            parents.append(0)
        elif kind == "deep":
            r = float(torch.rand((), generator=g))
            parents.append(i - 1 if r < 0.8 else int(torch.randint(0, i, (), generator=g)))
        else:
            # bushy: half the time a sibling-ish pick among the last few nodes, else anywhere
            lo = max(0, i - 4) if float(torch.rand((), generator=g)) < 0.5 else 0
            parents.append(int(torch.randint(lo, i, (), generator=g)))
    return parents


# --- SGLang's flattened custom mask -----------------------------------------------------
# SGLang's Triton extend/verify kernels take, per request b, a uint8 matrix of
# T_b rows x (prefix_b + T_b) columns, flattened row-major and concatenated over
# requests; mask_indptr[b] is the offset of request b's block.

def to_sglang_custom_mask(tree_mask: torch.Tensor, qo_indptr: torch.Tensor,
                          prefix_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed tree mask -> (custom_mask uint8 [sum T_b*(L_b+T_b)], mask_indptr int64 [B+1])."""
    qo = [int(x) for x in qo_indptr.cpu()]
    if len(prefix_lens) != len(qo) - 1:
        raise ValueError(f"prefix_lens has {len(prefix_lens)} entries, qo_indptr describes {len(qo) - 1} requests")
    chunks, offs = [], [0]
    packed = tree_mask.cpu()
    for b, lb in enumerate(prefix_lens):
        tb = qo[b + 1] - qo[b]
        dense = torch.ones(tb, lb + tb, dtype=torch.uint8)
        dense[:, lb:] = unpack_mask(packed[qo[b]:qo[b + 1]], tb).to(torch.uint8)
        chunks.append(dense.flatten())
        offs.append(offs[-1] + dense.numel())
    return torch.cat(chunks), torch.tensor(offs, dtype=torch.int64)


def from_sglang_custom_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor, qo_indptr: torch.Tensor,
                            prefix_lens: Sequence[int], words: int | None = None) -> torch.Tensor:
    """SGLang custom mask -> packed tree mask int32 [sum T_b, W]. The prefix part must be all ones."""
    qo = [int(x) for x in qo_indptr.cpu()]
    mi = [int(x) for x in mask_indptr.cpu()]
    cm = custom_mask.cpu()
    maxt = max(qo[b + 1] - qo[b] for b in range(len(qo) - 1))
    w = num_words(maxt) if words is None else words
    rows = []
    for b, lb in enumerate(prefix_lens):
        tb = qo[b + 1] - qo[b]
        block = cm[mi[b]: mi[b] + tb * (lb + tb)]
        if block.numel() != tb * (lb + tb):
            raise ValueError(f"custom_mask: request {b} needs {tb * (lb + tb)} entries, found {block.numel()}")
        dense = block.view(tb, lb + tb).bool()
        if lb and not bool(dense[:, :lb].all()):
            raise ValueError(f"custom_mask: request {b} hides part of its prefix; tree verify sees the whole prefix")
        rows.append(pack_mask(dense[:, lb:].contiguous(), w))
    return torch.cat(rows)
