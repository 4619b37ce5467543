"""Latent KV cache bookkeeping for one request, over all target layers.

Storage is one tensor per layer in the layout `tree_verify` reads (built on
verify_attn.layouts.PagedPool, so unused rows are NaN):
  page_size 1: k_cache [num_slots, 1, D]      (SGLang token pool)
  paged:       k_cache [num_pages, P, 1, D]   (FlashInfer pages)
and v_cache = k_cache[..., :kv_lora] (MLA: V is the first Dv values of the row).
One allocator serves every layer (a slot/page id means the same row in each).

Tree nodes: page_size 1 takes fresh slots; paged puts node i at logical
position L + i (after the committed prefix). Commit: page_size 1 appends the
accepted nodes' slots to the prefix and frees the rest (no KV copy); paged
copies the accepted rows to L, L+1, ... and frees pages past the new end.
Freed rows are refilled with NaN so a read of a dead row shows up.

The free list's order is the allocator policy (`alloc`): "shuffled" (a pool after heavy
churn: every row somewhere else), "contiguous" (a serving engine's sorted free list: a long
request gets mostly consecutive slots, freed ids go back in order), "fragmented" (runs of
consecutive ids of random length 8..256, the runs shuffled: a pool after moderate churn).
page_size=1 kernels read rows very differently on these patterns.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Sequence

import torch

from verify_attn.layouts import ALLOC_MODES, PagedPool, free_order  # noqa: F401 (re-exported)

class LatentKVCache:
    def __init__(self, num_layers: int, capacity_tokens: int, dim: int, dv: int, *, page_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", seed: int = 0,
                 alloc: str = "shuffled") -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if alloc not in ALLOC_MODES:
            raise ValueError(f"unknown allocator policy {alloc!r}; known: {', '.join(ALLOC_MODES)}")
        self.alloc = alloc
        self.page_size = page_size
        self.dim, self.dv = dim, dv
        num_pages = (capacity_tokens + page_size - 1) // page_size + 1
        self.pools = [PagedPool(num_pages, page_size, 1, dim, None, dtype=dtype, device=device, mla_dv=dv)
                      for _ in range(num_layers)]
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(10_000 + seed)
        # contiguous: a min-heap (the lowest free id first); otherwise a FIFO of the policy's order
        order = free_order(num_pages, alloc, g)
        self.free: list[int] | deque[int] = order if alloc == "contiguous" else deque(order)
        self.live: set[int] = set()
        self.pages: list[int] = []     # paged: the request's pages; page 1: its prefix slots
        self.length = 0                # committed tokens (L)
        self.tree_ids: list[int] = []  # page 1: slots of the current tree's nodes
        self.tree_size = 0
        # page 1: the slot ids on the device, preallocated: [0, _synced) mirror self.pages; a pending tree's
        # ids are written after the prefix (no per-step concatenation of the O(L) list)
        self._ids = torch.empty(num_pages + 1, dtype=torch.int32, device=self.device) if page_size == 1 else None
        self._synced = 0

    # -- tensors tree_verify takes -----------------------------------------------------------
    def k_cache(self, layer: int) -> torch.Tensor:
        return self.pools[layer].k_cache

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.pools[layer].v_cache

    # -- allocation ----------------------------------------------------------------------------
    def _alloc(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(f"KV pool exhausted: need {n} more {'slots' if self.page_size == 1 else 'pages'}, "
                               f"{len(self.free)} free")
        if self.alloc == "contiguous":
            ids = [heapq.heappop(self.free) for _ in range(n)]
        else:
            ids = [self.free.popleft() for _ in range(n)]
        for i in ids:
            if i in self.live:
                raise AssertionError(f"row/page {i} handed out while live")
            self.live.add(i)
        return ids

    def _release(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        for i in ids:
            if i not in self.live:
                raise AssertionError(f"row/page {i} freed but not live")
            self.live.remove(i)
        idx = torch.tensor(list(ids), dtype=torch.long, device=self.device)
        for p in self.pools:
            p.k.index_fill_(0, idx, float("nan"))
        if self.alloc == "contiguous":     # a sorted free list: the lowest ids are handed out first
            for i in ids:
                heapq.heappush(self.free, i)
        else:
            self.free.extend(ids)

    def _ensure_pages(self, tokens: int) -> None:
        need = (tokens + self.page_size - 1) // self.page_size
        if need > len(self.pages):
            self.pages += self._alloc(need - len(self.pages))

    def _rows(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(page ids, offsets) of logical positions [start, start+n) (paged)."""
        t = torch.arange(start, start + n)
        pg = torch.tensor(self.pages, dtype=torch.long)[t // self.page_size]
        return pg.to(self.device), (t % self.page_size).to(self.device)

    # -- prefill ------------------------------------------------------------------------------
    def extend(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append n committed rows (prefill); returns their (page, offset) addresses."""
        start = self.length
        if self.page_size == 1:
            self.pages += self._alloc(n)
            addr = (torch.tensor(self.pages[start:start + n], dtype=torch.long, device=self.device),
                    torch.zeros(n, dtype=torch.long, device=self.device))
        else:
            self._ensure_pages(start + n)
            addr = self._rows(start, n)
        self.length += n
        return addr

    def write(self, layer: int, addr: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor) -> None:
        """rows [n, D] written at addresses from extend()/begin_tree()."""
        pg, off = addr
        self.pools[layer].k[pg, off, 0] = rows.to(self.pools[layer].k.dtype)

    def prefix_rows(self, layer: int, n: int) -> torch.Tensor:
        """The first n committed rows [n, D] in logical order (for the dense prefill attention)."""
        ids = self._page_ids().long()
        if self.page_size == 1:
            return self.pools[layer].k[ids[:n], 0, 0]
        t = torch.arange(n, device=self.device)
        return self.pools[layer].k[ids[t // self.page_size], t % self.page_size, 0]

    def _page_ids(self) -> torch.Tensor:
        """self.pages as an int32 device tensor. Page 1: a view of the preallocated id buffer; the slot
        list only grows by appends between commits, so only the new tail is copied; paged: the list is
        short (L / P), rebuilt."""
        i32 = dict(dtype=torch.int32, device=self.device)
        if self.page_size > 1:
            return torch.tensor(self.pages, **i32)
        n = len(self.pages)
        if self._synced < n:
            self._ids[self._synced:n] = torch.tensor(self.pages[self._synced:n], **i32)
            self._synced = n
        return self._ids[:n]

    # -- a verify step ------------------------------------------------------------------------
    def begin_tree(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reserve rows for t tree nodes; returns their addresses in node order."""
        if self.tree_size:
            raise AssertionError("begin_tree called while a tree is pending (commit first)")
        self.tree_size = t
        if self.page_size == 1:
            self.tree_ids = self._alloc(t)
            return (torch.tensor(self.tree_ids, dtype=torch.long, device=self.device),
                    torch.zeros(t, dtype=torch.long, device=self.device))
        self._ensure_pages(self.length + t)
        return self._rows(self.length, t)

    def indices(self) -> dict[str, torch.Tensor]:
        """kv_indptr [2], kv_indices, kv_lens [1] for the prefix plus the pending tree (batch of one)."""
        i32 = dict(dtype=torch.int32, device=self.device)
        ids = self._page_ids()
        if self.page_size == 1 and self.tree_ids:
            n0 = ids.numel()
            self._ids[n0:n0 + len(self.tree_ids)] = torch.tensor(self.tree_ids, **i32)
            self._synced = min(self._synced, n0)            # the tree's ids sit where the prefix grows next
            ids = self._ids[:n0 + len(self.tree_ids)]
        n = self.length + self.tree_size
        return {"kv_indptr": torch.tensor([0, ids.numel()], **i32), "kv_indices": ids,
                "kv_lens": torch.tensor([n], **i32)}

    def commit(self, path: Sequence[int]) -> None:
        """Keep tree nodes `path` (root first, increasing node ids) as the next len(path) prefix rows."""
        t = self.tree_size
        if not path or path[0] != 0 or any(b <= a for a, b in zip(path, path[1:])) or path[-1] >= t:
            raise ValueError(f"path must start at the root and increase within the tree of {t} nodes, got {path}")
        if self.page_size == 1:
            keep = set(path)
            self.pages += [self.tree_ids[i] for i in path]
            self._release([s for i, s in enumerate(self.tree_ids) if i not in keep])
            self.tree_ids = []
        else:
            src = self._rows(self.length, t)
            sel = torch.tensor(list(path), dtype=torch.long, device=self.device)
            dst = self._rows(self.length, len(path))
            for p in self.pools:
                rows = p.k[src[0][sel], src[1][sel]].clone()         # gather first: sources and targets overlap
                p.k[dst[0], dst[1]] = rows
            end = self.length + len(path)
            if end < self.length + t:                                 # poison the dropped tail rows
                tail = self._rows(end, self.length + t - end)
                for p in self.pools:
                    p.k[tail[0], tail[1]] = float("nan")
            need = (end + self.page_size - 1) // self.page_size
            drop, self.pages = self.pages[need:], self.pages[:need]
            self._release(drop)
        self.length += len(path)
        self.tree_size = 0

    def check(self) -> None:
        """Bookkeeping invariants: every id is either free or live, never both; live == owned."""
        owned = set(self.pages) | set(self.tree_ids)
        if len(owned) != len(self.pages) + len(self.tree_ids):
            raise AssertionError("a row/page is owned twice")
        if owned != self.live:
            raise AssertionError(f"live set differs from owned rows: leaked {sorted(self.live - owned)[:8]}, "
                                 f"untracked {sorted(owned - self.live)[:8]}")
        if set(self.free) & self.live or len(set(self.free)) != len(self.free):
            raise AssertionError("free list overlaps live rows or repeats an id")
        if len(self.free) + len(self.live) != self.pools[0].num_pages:
            raise AssertionError("rows lost: free + live != pool size")
        if self.page_size == 1 and len(self.pages) != self.length:
            raise AssertionError(f"prefix slots {len(self.pages)} != length {self.length}")
