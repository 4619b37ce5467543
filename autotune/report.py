"""Reading the CUDA build report (`python -m verify_attn.build --report --json PATH`) for pruning.

Rows are {name, arch, registers, smem_bytes, spill_stores, spill_loads, ...};
verify_attn.build names split kernels 'split bf16 576x512 page1 m32 n16 w4 s3'.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from verify_attn.config import KernelConfig
from verify_attn.shapes import HeadShape

_REPORT_NAME = re.compile(r"^split (?P<dtype>\w+) (?P<dqk>\d+)x(?P<dv>\d+) (?P<layout>\w+) m(?P<block_m>\d+) "
                          r"n(?P<block_n>\d+) w(?P<num_warps>\d+) s(?P<num_stages>\d+)$")


def report_fields(row: dict) -> dict:
    """Tile/shape fields of a build-report row: explicit keys, a nested 'config', or parsed from the name
    (verify_attn.build names split kernels 'split bf16 576x512 page1 m32 n16 w4 s3')."""
    fields: dict[str, Any] = {}
    m = _REPORT_NAME.match(str(row.get("name", "")))
    if m:
        fields.update({k: (v if k in ("dtype", "layout") else int(v)) for k, v in m.groupdict().items()})
    if isinstance(row.get("config"), dict):
        fields.update(row["config"])
    fields.update({k: row[k] for k in ("block_n", "block_m", "num_warps", "num_stages", "dqk", "dv", "dtype",
                                       "layout") if k in row})
    return fields


def report_entry(report: Optional[list[dict]], cfg: KernelConfig, shape: HeadShape, arch: str,
                 dtype: str = "bf16", page_size: int = 1) -> Optional[dict]:
    """The build-report row of the kernel this config launches, if the report names it.

    A row matches when it has the same arch and every config/shape field it
    states (block_n, block_m, num_warps, num_stages, dqk, dv, dtype, layout)
    agrees; rows that state no tile fields (e.g. the combine) match no config.
    """
    if not report:
        return None
    want = {"block_n": cfg.block_n, "block_m": cfg.block_m, "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages, "dqk": shape.head_dim_qk, "dv": shape.head_dim_v, "dtype": dtype,
            "layout": "page1" if page_size == 1 else "paged"}
    for row in report:
        if str(row.get("arch", "")).lower() != arch.lower():
            continue
        fields = report_fields(row)
        if not any(k in fields for k in ("block_n", "block_m", "num_warps", "num_stages")):
            continue
        if all(str(fields[k]) == str(v) for k, v in want.items() if k in fields):
            return row
    return None
