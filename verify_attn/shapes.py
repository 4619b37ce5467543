"""Head-shape presets shared by bench, autotune and integration."""
from __future__ import annotations

import math
from dataclasses import dataclass

# Kimi K2 / DeepSeek-V3 MLA: softmax scale is 1/sqrt(qk_nope + qk_rope) = 1/sqrt(192)
# times the YaRN mscale squared (mscale = 0.1 * mscale_all_dim * ln(factor) + 1,
# factor 32, mscale_all_dim 1.0 in Kimi K2's config). It is a model parameter:
# never derived from the 576-wide absorbed head.
_KIMI_YARN_MSCALE = 0.1 * 1.0 * math.log(32.0) + 1.0
KIMI_K2_SM_SCALE = _KIMI_YARN_MSCALE**2 / math.sqrt(192.0)


@dataclass(frozen=True)
class HeadShape:
    name: str
    num_q_heads: int    # Hq per rank
    num_kv_heads: int   # Hkv per rank
    head_dim_qk: int    # Dqk
    head_dim_v: int     # Dv
    sm_scale: float
    mla: bool           # V is the first Dv values of the K row (one latent KV head)

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def key(self) -> str:
        return f"dqk={self.head_dim_qk},dv={self.head_dim_v},hq={self.num_q_heads},hkv={self.num_kv_heads}"

    def to_dict(self) -> dict:
        return {
            "name": self.name, "hq": self.num_q_heads, "hkv": self.num_kv_heads,
            "dqk": self.head_dim_qk, "dv": self.head_dim_v, "sm_scale": self.sm_scale, "mla": self.mla,
        }


PRESETS: dict[str, HeadShape] = {
    s.name: s
    for s in [
        HeadShape("kimi-k2-tp8", 8, 1, 576, 512, KIMI_K2_SM_SCALE, True),
        HeadShape("deepseek-v3-tp8", 16, 1, 576, 512, KIMI_K2_SM_SCALE, True),
        # Llama-3-70B: 64 q heads, 8 kv heads, d=128 -> TP8: 8 q heads, 1 kv head.
        HeadShape("llama3-70b-tp8", 8, 1, 128, 128, 1.0 / math.sqrt(128), False),
        # Qwen3-8B: 32 q heads, 8 kv heads, d=128, one GPU.
        HeadShape("qwen3-8b", 32, 8, 128, 128, 1.0 / math.sqrt(128), False),
        HeadShape("gqa-d64", 16, 2, 64, 64, 1.0 / 8.0, False),
        HeadShape("gqa-d256", 8, 2, 256, 256, 1.0 / 16.0, False),
    ]
}


def get_shape(name: str) -> HeadShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown shape preset {name!r}; known: {', '.join(PRESETS)}") from None


def custom_shape(hq: int, hkv: int, dqk: int, dv: int, sm_scale: float | None = None) -> HeadShape:
    if min(hq, hkv, dqk, dv) < 1:
        raise ValueError(f"head counts and dims must be >= 1, got hq={hq} hkv={hkv} dqk={dqk} dv={dv}")
    if hq % hkv:
        raise ValueError(f"hq ({hq}) must be a multiple of hkv ({hkv})")
    if dv > dqk and hkv == 1 and dqk == 576:
        raise ValueError(f"dv ({dv}) must be <= dqk ({dqk}) for MLA")
    mla = hkv == 1 and dv < dqk
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dqk)
    return HeadShape(f"custom-hq{hq}-hkv{hkv}-d{dqk}-{dv}", hq, hkv, dqk, dv, scale, mla)
