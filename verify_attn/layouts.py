"""KV cache layouts: a page_size=1 slot pool (SGLang style) and a paged pool (FlashInfer style).

Both build the index arguments of `tree_verify`: `kv_indptr`, `kv_indices`
(slot ids or page ids; the committed prefix first, then the tree nodes in node
order) and `kv_lens` (L_b + T_b). `lay_out` puts the same logical sequences in
either layout, with shuffled slots/pages and NaN in every slot a request does
not own, so that any read outside the contract shows up as NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

# Slot / page allocator policies of a serving pool (the decode loop's cache and the benchmark's inputs):
# shuffled (a pool after heavy churn), contiguous (a sorted free list), fragmented (shuffled runs of 8..256 ids)
ALLOC_MODES = ("shuffled", "contiguous", "fragmented")


def free_order(n: int, mode: str, generator: torch.Generator) -> list[int]:
    """The initial free list of a pool of n rows/pages under allocator policy `mode` (ALLOC_MODES)."""
    if mode == "shuffled":
        return torch.randperm(n, generator=generator).tolist()
    if mode == "contiguous":
        return list(range(n))
    if mode == "fragmented":
        runs, start = [], 0
        while start < n:
            length = int(torch.randint(8, 257, (), generator=generator))
            runs.append(list(range(start, min(n, start + length))))
            start += length
        order = torch.randperm(len(runs), generator=generator).tolist()
        return [i for r in order for i in runs[r]]
    raise ValueError(f"unknown allocator policy {mode!r}; known: {', '.join(ALLOC_MODES)}")



@dataclass
class PagedPool:
    """A pool of `num_pages` pages of `page_size` rows, `num_kv_heads` heads of `head_dim`.

    page_size == 1 is the SGLang slot pool: then the cache is [num_slots, Hkv, D].
    With `head_dim_v` None the pool is MLA-style: V is the first Dv values of K's row.
    """

    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: Optional[int] = None
    dtype: torch.dtype = torch.bfloat16
    device: torch.device | str = "cpu"
    fill: float = float("nan")
    mla_dv: Optional[int] = None  # MLA: Dv of the aliased V view

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= 128:
            raise ValueError(f"page_size must be in 1..128, got {self.page_size}")
        if self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        shape = (self.num_pages, self.page_size, self.num_kv_heads)
        self.k = torch.full(shape + (self.head_dim,), self.fill, dtype=self.dtype, device=self.device)
        self.v = (None if self.head_dim_v is None else
                  torch.full(shape + (self.head_dim_v,), self.fill, dtype=self.dtype, device=self.device))
        self.free = list(range(self.num_pages))

    # the tensors tree_verify takes
    @property
    def k_cache(self) -> torch.Tensor:
        return self.k[:, 0] if self.page_size == 1 else self.k

    @property
    def v_cache(self) -> torch.Tensor:
        if self.v is None:
            dv = self.mla_dv if self.mla_dv is not None else self.head_dim
            return self.k_cache[..., :dv]
        return self.v[:, 0] if self.page_size == 1 else self.v

    def alloc(self, n: int, generator: torch.Generator | None = None) -> list[int]:
        """Take n free pages (random ones when a generator is given)."""
        if n > len(self.free):
            raise RuntimeError(f"pool exhausted: asked for {n} pages, {len(self.free)} free")
        if generator is not None:
            perm = torch.randperm(len(self.free), generator=generator).tolist()
            picked = [self.free[i] for i in perm[:n]]
            taken = set(picked)
            self.free = [p for p in self.free if p not in taken]
            return picked
        picked, self.free = self.free[:n], self.free[n:]
        return picked

    def release(self, pages: Sequence[int]) -> None:
        for p in pages:
            if p in self.free:
                raise RuntimeError(f"page {p} released twice")
            self.k[p] = self.fill
            if self.v is not None:
                self.v[p] = self.fill
            self.free.append(p)

    def write(self, pages: Sequence[int], start: int, k: torch.Tensor, v: Optional[torch.Tensor] = None) -> None:
        """Write rows k[i] ([n, Hkv, D]) at logical token positions start+i of a request owning `pages`."""
        n = k.shape[0]
        t = torch.arange(start, start + n)
        pg = torch.tensor(pages, dtype=torch.long)[t // self.page_size]
        off = t % self.page_size
        self.k[pg, off] = k.to(self.dtype).to(self.k.device)
        if self.v is not None:
            if v is None:
                raise ValueError("this pool keeps a separate V: pass v")
            self.v[pg, off] = v.to(self.dtype).to(self.v.device)


def SlotPool(num_slots: int, num_kv_heads: int, head_dim: int, head_dim_v: Optional[int] = None, **kw) -> PagedPool:
    """The page_size=1 pool: one slot per token."""
    return PagedPool(num_slots, 1, num_kv_heads, head_dim, head_dim_v, **kw)


def build_indices(page_lists: Sequence[Sequence[int]], kv_lens: Sequence[int],
                  device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    indptr = [0]
    for pl in page_lists:
        indptr.append(indptr[-1] + len(pl))
    flat = [p for pl in page_lists for p in pl]
    return {
        "kv_indptr": torch.tensor(indptr, dtype=torch.int32, device=device),
        "kv_indices": torch.tensor(flat, dtype=torch.int32, device=device),
        "kv_lens": torch.tensor(list(kv_lens), dtype=torch.int32, device=device),
    }


def lay_out(seqs_k: Sequence[torch.Tensor], seqs_v: Optional[Sequence[torch.Tensor]], page_size: int, *,
            mla_dv: Optional[int] = None, shuffle: bool = True, poison: bool = True, spare: float = 0.5,
            generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None) -> dict:
    """Lay per-request logical KV sequences ([n_b, Hkv, D] each) into a pool.

    seqs_v None means MLA: V is k_cache[..., :mla_dv]. `spare` adds that fraction
    of unused pages (poisoned with NaN when `poison`). Returns the tree_verify
    arguments k_cache, v_cache, kv_indptr, kv_indices, kv_lens, and the pool.
    """
    if not seqs_k:
        raise ValueError("lay_out needs at least one sequence")
    hkv, d = seqs_k[0].shape[1:]
    dv = None if seqs_v is None else seqs_v[0].shape[-1]
    dtype = dtype or seqs_k[0].dtype
    device = device or seqs_k[0].device
    need = [(s.shape[0] + page_size - 1) // page_size for s in seqs_k]
    total = sum(need)
    num_pages = max(1, total + int(total * spare) + 1)
    pool = PagedPool(num_pages, page_size, hkv, d, dv, dtype=dtype, device=device,
                     fill=float("nan") if poison else 0.0, mla_dv=mla_dv)
    g = generator if (shuffle and generator is not None) else (torch.Generator().manual_seed(1) if shuffle else None)
    page_lists = []
    for b, s in enumerate(seqs_k):
        pages = pool.alloc(need[b], g)
        if s.shape[0]:
            pool.write(pages, 0, s, None if seqs_v is None else seqs_v[b])
        page_lists.append(pages)
    idx = build_indices(page_lists, [s.shape[0] for s in seqs_k], device=device)
    return {"k_cache": pool.k_cache, "v_cache": pool.v_cache, **idx, "pool": pool}


def gather_rows(cache: torch.Tensor, kv_indices_b: torch.Tensor, page_size: int, start: int, n: int) -> torch.Tensor:
    """Rows of logical tokens [start, start+n) of one request: [n, Hkv, D].

    Row address of token t: slot kv_indices[t] (page_size 1) or page
    kv_indices[t // P], offset t % P (paged).
    """
    t = torch.arange(start, start + n, device=kv_indices_b.device)
    if page_size == 1:
        return cache[kv_indices_b[t].long()]
    return cache[kv_indices_b[t // page_size].long(), t % page_size]
