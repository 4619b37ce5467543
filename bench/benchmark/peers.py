"""The Hopper MLA kernels serving engines run today, as bench.verify backends (issue 42).

- "fa3-mla": what SGLang's default Hopper backend ("fa3", `srt/layers/attention/flashattention_backend.py`,
  target verify with topk > 1) runs for a DeepSeek/Kimi tree: FA3's `flash_attn_with_kvcache` with
  `q=q_rope, qv=q_nope, k_cache=k_rope, v_cache=c_kv` twice, then an LSE merge:
    1. the prefix pass: one sequence per request, its page table the prefix's slots, `cache_seqlens = L_b`,
       `causal=False`, `return_softmax_lse=True`;
    2. the tree pass: every tree node its own sequence (`cu_seqlens_q = arange`), its page-table row the
       slots of the nodes its mask row sets, in node order, then the others (SGLang sorts the keys
       `where(mask, col, col + T)`), `cache_seqlens = popcount(mask row)`;
    3. merge_state_v2 (sgl-kernel) of the two, here `merge_states` (one Triton kernel on a GPU, torch on the
       CPU): same arithmetic, an empty pass's LSE of +inf read as -inf.
  Departures: a paged pool is read through its page-1 row view (token row ids; SGLang's topk > 1 path is
  page_size=1); SGLang transposes the LSEs into contiguous [rows, heads] copies, the merge here reads them
  strided.
- "flashmla": FlashMLA's sm90 dense decode (page 64, bf16, no tree mask: it refuses topk > 1) over the
  prefix, the tree part in torch (each node's ancestors' rows gathered, fp32), and the same merge. A page-64
  pool is read in place; any other layout's prefix rows are copied into a page-64 pool first (host-side,
  outside timing: FlashMLA then reads 64-token contiguous blocks, not the caller's scattered rows). The
  prefix pass alone is timed apart as the row's `parts_us["prefix"]`: the speed-of-light reference for the
  prefix part.

The kernels themselves are found by bench/benchmark/peer_bundle.py (their packages, else the carried bundle).

The plumbing (page tables, sequence lengths, q split, block tables, layouts, merge) is plain torch taking the
kernel as an argument, so tests/test_peers.py checks it on the CPU with stand-ins that compute what the
kernels document. NOTHING HERE HAS RUN ON A GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from verify_attn.tree import unpack_mask

FLASHMLA_PAGE = 64                             # FlashMLA's dense decode takes page_block_size 64 only
MLA_DQK, MLA_DV = 576, 512

# kernel signatures the prepare functions take (the real ones, or the tests' stand-ins)
Fa3Fn = Callable[..., tuple]                   # flash_attn_with_kvcache(q, k_cache, v_cache, qv=, ...) -> (out, lse, ...)
MlaFn = Callable[..., tuple]                   # decode(q, k_cache, block_table, seqlens, scale) -> (out, lse)


# ------------------------------------------------------------------ the rows a request reads

@dataclass
class Rows:
    """The caller's cache as rows: `pool` [rows, 576] (a view, no copy) and, per request, the row ids of its
    L_b prefix tokens then its T_b tree nodes (node order)."""

    pool: torch.Tensor                 # [rows, 576]
    ids: list[torch.Tensor]            # per request: int64 [L_b + T_b]
    prefix: list[int]                  # L_b
    nodes: list[int]                   # T_b
    qo: list[int]                      # qo_indptr


def check_mla(kw: dict, name: str) -> None:
    """NotImplementedError (the row's 'unsupported' reason) unless `kw` is the MLA 576/512 one-latent-head
    problem in a 16-bit cache; ValueError naming the argument for malformed input."""
    q, k = kw["q"], kw["k_cache"]
    if q.dim() != 3:
        raise ValueError(f"q must be [total_q, heads, 576], got shape {tuple(q.shape)}")
    if kw.get("kv_format") or k.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise NotImplementedError(f"{name}: 16-bit caches only in this adapter")
    if not (q.shape[-1] == MLA_DQK and kw["v_cache"].shape[-1] == MLA_DV and k.shape[-2] == 1):
        raise NotImplementedError(f"{name}: MLA 576/512 with one latent KV head only")
    if kw["page_size"] < 1:
        raise ValueError(f"page_size must be >= 1, got {kw['page_size']}")


def rows_of(kw: dict) -> Rows:
    """The caller's pool as [rows, 576] and each request's row ids: slot ids for page_size=1, page * P +
    offset for a paged pool (its page-1 view)."""
    k, page = kw["k_cache"], kw["page_size"]
    pool = k.reshape(-1, k.shape[-1])                                   # [slots or pages*P, 576]
    qo = [int(x) for x in kw["qo_indptr"].tolist()]
    kvp = [int(x) for x in kw["kv_indptr"].tolist()]
    lens = [int(x) for x in kw["kv_lens"].tolist()]
    if len(qo) != len(lens) + 1 or len(kvp) != len(qo):
        raise ValueError(f"qo_indptr ({len(qo)}), kv_indptr ({len(kvp)}) and kv_lens ({len(lens)}) disagree on "
                         "the batch size")
    idx = kw["kv_indices"].long()
    ids, prefix, nodes = [], [], []
    for b in range(len(lens)):
        t = qo[b + 1] - qo[b]
        if t < 1 or lens[b] < t:
            raise ValueError(f"kv_lens[{b}] = {lens[b]} must cover the request's {t} (>= 1) tree nodes")
        tok = torch.arange(lens[b], device=idx.device)
        if page == 1:
            r = idx[kvp[b]: kvp[b] + lens[b]]
        else:
            r = idx[kvp[b] + tok // page] * page + tok % page
        ids.append(r)
        prefix.append(lens[b] - t)
        nodes.append(t)
    return Rows(pool, ids, prefix, nodes, qo)


def _table(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    """int32 [len(rows), max(width, 1)]: each row's ids, zero-padded (never read: past the sequence length)."""
    t = torch.zeros(len(rows), max(width, 1), dtype=torch.int32, device=device)
    for i, r in enumerate(rows):
        t[i, : r.numel()] = r.to(torch.int32)
    return t


# ------------------------------------------------------------------ FA3 (SGLang's fa3 backend)

@dataclass
class Fa3Plan:
    """The two passes' metadata, as SGLang's `init_forward_metadata` builds it for target verify, topk > 1."""

    prefix_table: torch.Tensor         # int32 [B, max L_b]: prefix row ids
    prefix_lens: torch.Tensor          # int32 [B]: L_b
    cu_q: torch.Tensor                 # int32 [B + 1]: qo_indptr
    max_q: int                         # max T_b
    tree_table: torch.Tensor           # int32 [total_q, max T_b]: visible tree rows first, in node order
    tree_lens: torch.Tensor            # int32 [total_q]: popcount of the node's mask row
    cu_tree: torch.Tensor              # int32 [total_q + 1]: 0, 1, ..., total_q (one row per sequence)


def fa3_plan(kw: dict, rows: Optional[Rows] = None) -> Fa3Plan:
    rows = rows or rows_of(kw)
    dev = kw["q"].device
    tree_rows, tree_lens = [], []
    for b, (ids, lp, t) in enumerate(zip(rows.ids, rows.prefix, rows.nodes)):
        vis = unpack_mask(kw["tree_mask"][rows.qo[b]: rows.qo[b + 1]].cpu(), t)          # bool [T, T]
        col = torch.arange(t).expand(t, t)
        order = torch.sort(torch.where(vis, col, col + t), dim=1, stable=True).indices  # SGLang's sort keys
        tree_ids = ids[lp:].cpu()                                                       # [T] the nodes' rows
        tree_rows += list(tree_ids[order])                                              # T rows of [T]
        tree_lens += vis.sum(1).tolist()
    total_q = rows.qo[-1]
    return Fa3Plan(
        prefix_table=_table([ids[:lp] for ids, lp in zip(rows.ids, rows.prefix)], max(rows.prefix), dev),
        prefix_lens=torch.tensor(rows.prefix, dtype=torch.int32, device=dev),
        cu_q=kw["qo_indptr"].to(device=dev, dtype=torch.int32),
        max_q=max(rows.nodes),
        tree_table=_table(tree_rows, max(rows.nodes), dev),
        tree_lens=torch.tensor(tree_lens, dtype=torch.int32, device=dev),
        cu_tree=torch.arange(total_q + 1, dtype=torch.int32, device=dev),
    )


def fa3_mla_prepare(fa3: Fa3Fn, kw: dict) -> Callable[[torch.Tensor], None]:
    """Host-side preparation (outside timing) -> run(out): the prefix pass, the tree pass, the merge."""
    check_mla(kw, "fa3-mla")
    rows = rows_of(kw)
    plan = fa3_plan(kw, rows)
    q = kw["q"]
    q_nope, q_rope = q[..., :MLA_DV].contiguous(), q[..., MLA_DV:].contiguous()   # [total_q, H, 512] / [.., 64]
    k_rope = rows.pool[:, MLA_DV:].unsqueeze(1).unsqueeze(1)                      # [rows, 1 (page), 1, 64]
    c_kv = rows.pool[:, :MLA_DV].unsqueeze(1).unsqueeze(1)                        # [rows, 1 (page), 1, 512]
    scale = kw["sm_scale"]

    def prefix() -> tuple[torch.Tensor, torch.Tensor]:
        o, lse, *_ = fa3(q_rope, k_rope, c_kv, qv=q_nope, page_table=plan.prefix_table,
                         cache_seqlens=plan.prefix_lens, cu_seqlens_q=plan.cu_q, max_seqlen_q=plan.max_q,
                         softmax_scale=scale, causal=False, return_softmax_lse=True)
        return o, lse                                                             # [total_q, H, 512], [H, total_q]

    def tree() -> tuple[torch.Tensor, torch.Tensor]:
        o, lse, *_ = fa3(q_rope, k_rope, c_kv, qv=q_nope, page_table=plan.tree_table,
                         cache_seqlens=plan.tree_lens, cu_seqlens_q=plan.cu_tree, max_seqlen_q=1,
                         softmax_scale=scale, causal=False, return_softmax_lse=True)
        return o, lse

    def run(out: torch.Tensor) -> None:
        (oa, la), (ob, lb) = prefix(), tree()
        merge_states(oa, la.t(), ob, lb.t(), out)

    run.parts = {"prefix": prefix, "tree": tree}   # timed apart by bench.core.measure (the row's parts_us)
    if kw["page_size"] != 1:
        run.departure = (f"the page-{kw['page_size']} pool read through its page-1 row view (SGLang's topk > 1 "
                         "path is page_size=1)")
    return run


# ------------------------------------------------------------------ FlashMLA dense decode + tree part

@dataclass
class MlaPlan:
    """FlashMLA's inputs (page 64, one batch entry per request, T_b query tokens padded to max T_b) and the
    torch tree part's."""

    k_cache: torch.Tensor              # [pages, 64, 1, 576]: the caller's pool, or a page-64 copy of the prefixes
    block_table: torch.Tensor          # int32 [B, max pages]
    seqlens: torch.Tensor              # int32 [B]: L_b
    q: torch.Tensor                    # [B, max T, H, 576] (padded rows: zeros, dropped)
    flat: torch.Tensor                 # int64 [total_q]: row b * max T + t of each node in the padded layout
    tree_ids: torch.Tensor             # int64 [B, max T]: the nodes' rows in `rows.pool` (padding: the first node)
    tree_vis: torch.Tensor             # bool [B, max T, max T]: node i sees node j (padded rows: node 0)
    copied: bool                       # the prefix rows were copied into a page-64 pool


def flashmla_plan(kw: dict, rows: Optional[Rows] = None, seed: int = 0) -> MlaPlan:
    rows = rows or rows_of(kw)
    q = kw["q"]
    dev, b_n, t_max = q.device, len(rows.nodes), max(rows.nodes)
    P = FLASHMLA_PAGE
    if kw["page_size"] == P:   # read in place: the page list's first ceil(L_b / 64) pages hold the prefix
        k_cache = kw["k_cache"]
        kvp = kw["kv_indptr"].tolist()
        tables = [kw["kv_indices"][kvp[b]: kvp[b] + -(-lp // P)] for b, lp in enumerate(rows.prefix)]
        copied = False
    else:                      # copy the prefix rows into fresh pages, in a shuffled page order; NaN elsewhere
        n_pages = [-(-lp // P) for lp in rows.prefix]
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(max(sum(n_pages), 1), generator=g)
        k_cache = torch.full((max(sum(n_pages), 1), P, 1, MLA_DQK), float("nan"), dtype=rows.pool.dtype, device=dev)
        flat_pool = k_cache.view(-1, MLA_DQK)
        tables, start = [], 0
        for ids, lp, n in zip(rows.ids, rows.prefix, n_pages):
            pages = order[start: start + n].to(dev)
            start += n
            tok = torch.arange(lp, device=dev)
            flat_pool[pages[tok // P] * P + tok % P] = rows.pool[ids[:lp]]
            tables.append(pages)
        copied = True
    flat = torch.cat([b * t_max + torch.arange(t) for b, t in enumerate(rows.nodes)]).to(dev)
    qp = torch.zeros(b_n * t_max, q.shape[1], MLA_DQK, dtype=q.dtype, device=dev)
    qp[flat] = q
    tree_ids = torch.empty(b_n, t_max, dtype=torch.long)
    vis = torch.zeros(b_n, t_max, t_max, dtype=torch.bool)
    for b, (ids, lp, t) in enumerate(zip(rows.ids, rows.prefix, rows.nodes)):
        tree_ids[b] = ids[lp].cpu()
        tree_ids[b, :t] = ids[lp:].cpu()
        vis[b, :, 0] = True
        vis[b, :t, :t] = unpack_mask(kw["tree_mask"][rows.qo[b]: rows.qo[b + 1]].cpu(), t)
    return MlaPlan(k_cache=k_cache, block_table=_table(tables, max(len(x) for x in tables), dev),
                   seqlens=torch.tensor(rows.prefix, dtype=torch.int32, device=dev),
                   q=qp.view(b_n, t_max, q.shape[1], MLA_DQK), flat=flat, tree_ids=tree_ids.to(dev),
                   tree_vis=vis.to(dev), copied=copied)


def tree_part(q: torch.Tensor, pool: torch.Tensor, tree_ids: torch.Tensor, vis: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each node to its ancestors and itself, in fp32 torch: q [B, T, H, 576], pool [rows, 576],
    tree_ids [B, T], vis [B, T, T] -> (out [B, T, H, 512] fp32, lse [B, T, H] natural log)."""
    k = pool[tree_ids].float()                                                  # [B, T, 576]
    s = torch.einsum("bthd,bjd->bthj", q.float(), k) * scale                    # [B, T, H, T]
    s = s.masked_fill(~vis[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                            # [B, T, H]
    o = torch.einsum("bthj,bjd->bthd", torch.exp(s - lse[..., None]), k[..., :MLA_DV])
    return o, lse


def flashmla_prepare(decode: MlaFn, kw: dict) -> Callable[[torch.Tensor], None]:
    """Host-side preparation (outside timing) -> run(out): FlashMLA over the prefix, the torch tree part, the
    merge. `decode(q [B, S, H, 576], k_cache [pages, 64, 1, 576], block_table, seqlens, scale)` returns
    (out [B, S, H, 512], lse [B, H, S], natural log)."""
    check_mla(kw, "flashmla")
    if kw["q"].dtype != torch.bfloat16 and kw["q"].is_cuda:
        raise NotImplementedError("flashmla: the sm90 dense decode is built for bf16 only")
    rows = rows_of(kw)
    plan = flashmla_plan(kw, rows)
    scale = kw["sm_scale"]
    b_n, t_max, h = plan.q.shape[:3]

    def prefix() -> tuple[torch.Tensor, torch.Tensor]:
        return decode(plan.q, plan.k_cache, plan.block_table, plan.seqlens, scale)

    def tree() -> tuple[torch.Tensor, torch.Tensor]:
        return tree_part(plan.q, rows.pool, plan.tree_ids, plan.tree_vis, scale)

    def run(out: torch.Tensor) -> None:
        (oa, la), (ob, lb) = prefix(), tree()
        oa = oa.reshape(b_n * t_max, h, MLA_DV)[plan.flat]                      # [total_q, H, 512]
        la = la.transpose(1, 2).reshape(b_n * t_max, h)[plan.flat]              # [total_q, H]
        merge_states(oa, la, ob.reshape(b_n * t_max, h, MLA_DV)[plan.flat], lb.reshape(b_n * t_max, h)[plan.flat],
                     out)

    run.parts = {"prefix": prefix, "tree": tree}
    run.copied = plan.copied
    run.departure = "FlashMLA has no tree mask: the tree part in torch (fp32), merged" + (
        f"; the prefix copied from page-{kw['page_size']} into page-64 pages (64-token contiguous blocks, not "
        "the pool's rows)" if plan.copied else "")
    return run


# ------------------------------------------------------------------ the LSE merge (sgl-kernel's merge_state_v2)

def merge_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
                 out: torch.Tensor) -> None:
    """out = the softmax-weighted union of two partial attentions: o_* [N, H, D], lse_* [N, H] (natural log,
    any strides; +inf, an empty pass in FA3/FlashMLA, counts as -inf), out [N, H, D]. One Triton kernel on a
    GPU (as merge_state_v2 is one kernel), torch elsewhere."""
    if o_a.shape != o_b.shape or o_a.shape != out.shape or lse_a.shape != o_a.shape[:2] or lse_b.shape != lse_a.shape:
        raise ValueError(f"merge_states: o_a {tuple(o_a.shape)}, o_b {tuple(o_b.shape)}, out {tuple(out.shape)} "
                         f"must match and lse_a {tuple(lse_a.shape)}, lse_b {tuple(lse_b.shape)} be their [N, H]")
    if out.is_cuda and _merge_kernel() is not None:
        _merge_triton(o_a, lse_a, o_b, lse_b, out)
        return
    la = torch.where(lse_a == float("inf"), float("-inf"), lse_a.float())
    lb = torch.where(lse_b == float("inf"), float("-inf"), lse_b.float())
    m = torch.maximum(la, lb)
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    out.copy_((o_a.float() * wa[..., None] + o_b.float() * wb[..., None]) / (wa + wb)[..., None])


_KERNEL: list = []


def _merge_kernel():
    """The Triton merge kernel, compiled lazily (None where Triton is absent)."""
    if _KERNEL:
        return _KERNEL[0]
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _KERNEL.append(None)
        return None

    @triton.jit
    def merge(oa, la, ob, lb, out, s_oa_n, s_oa_h, s_la_n, s_la_h, s_ob_n, s_ob_h, s_lb_n, s_lb_h, s_o_n, s_o_h,
              D: tl.constexpr, BD: tl.constexpr):
        n, h = tl.program_id(0), tl.program_id(1)
        a = tl.load(la + n * s_la_n + h * s_la_h)
        b = tl.load(lb + n * s_lb_n + h * s_lb_h)
        a = tl.where(a == float("inf"), float("-inf"), a)
        b = tl.where(b == float("inf"), float("-inf"), b)
        m = tl.maximum(a, b)
        wa, wb = tl.exp(a - m), tl.exp(b - m)
        d = tl.arange(0, BD)
        keep = d < D
        xa = tl.load(oa + n * s_oa_n + h * s_oa_h + d, mask=keep).to(tl.float32)
        xb = tl.load(ob + n * s_ob_n + h * s_ob_h + d, mask=keep).to(tl.float32)
        y = (xa * wa + xb * wb) / (wa + wb)
        tl.store(out + n * s_o_n + h * s_o_h + d, y.to(out.dtype.element_ty), mask=keep)

    _KERNEL.append(merge)
    return merge


def _merge_triton(o_a, lse_a, o_b, lse_b, out) -> None:
    import triton
    for t, name in ((o_a, "o_a"), (o_b, "o_b"), (out, "out")):
        if t.stride(-1) != 1:
            raise ValueError(f"merge_states: {name} needs a contiguous last dimension")
    n, h, d = out.shape
    _merge_kernel()[(n, h)](o_a, lse_a, o_b, lse_b, out, o_a.stride(0), o_a.stride(1), lse_a.stride(0),
                            lse_a.stride(1), o_b.stride(0), o_b.stride(1), lse_b.stride(0), lse_b.stride(1),
                            out.stride(0), out.stride(1), D=d, BD=triton.next_power_of_2(d))
