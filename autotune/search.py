"""The tuning loop for one (context, tree size) bucket, with an injectable timer and checker.

Order (coarse to fine, so one shape's default buckets take minutes, not hours):
1. tiles: every tile that survived pruning, at its heuristic split count;
2. splits: the `top_tiles` fastest tiles over their coarse split grid (powers of
   two and fractions/multiples of one wave, `autotune.space.split_grid`);
3. refine: geometric midpoints around each of those tiles' best split count,
   `refine_rounds` times;
4. the backend's default config, timed for the gain it is compared against (it
   may win: a correct config is a candidate whatever its phase).

Every config is checked against the reference (`checker`) before it is timed; a
wrong config is recorded with the reason and never timed, so it can never win.
A timer or checker that raises marks that config failed; the loop goes on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from verify_attn.config import KernelConfig

from .splits import refine_points

Timer = Callable[[KernelConfig], float]               # median microseconds per call with this config
Checker = Callable[[KernelConfig], Optional[str]]     # None if the output matches the reference, else why not


@dataclass
class Trial:
    config: KernelConfig
    phase: str                   # tiles | splits | refine | default
    time_us: Optional[float]     # None when rejected or failed
    error: Optional[str] = None  # why it was rejected (wrong output) or failed (exception)
    wrong: bool = False          # the checker rejected its output

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "phase": self.phase, "time_us": self.time_us,
                "error": self.error, "wrong": self.wrong}


@dataclass
class BucketResult:
    ctx: int
    tree_nodes: int
    best: Optional[KernelConfig] = None
    best_us: Optional[float] = None
    default_config: Optional[KernelConfig] = None
    default_us: Optional[float] = None
    floor_us: Optional[float] = None
    trials: list[Trial] = field(default_factory=list)

    @property
    def gain(self) -> Optional[float]:
        """Default time / tuned time (> 1: the tuned config is faster)."""
        if self.best_us and self.default_us:
            return self.default_us / self.best_us
        return None

    @property
    def wrong(self) -> list[Trial]:
        return [t for t in self.trials if t.wrong]

    def to_dict(self) -> dict:
        return {
            "ctx": self.ctx, "tree_nodes": self.tree_nodes,
            "config": None if self.best is None else self.best.to_dict(),
            "time_us": self.best_us, "floor_us": self.floor_us,
            "frac_of_floor": (self.floor_us / self.best_us) if (self.floor_us and self.best_us) else None,
            "default_config": None if self.default_config is None else self.default_config.to_dict(),
            "default_us": self.default_us, "gain_over_default": self.gain,
            "wrong_configs": [{"config": t.config.to_dict(), "error": t.error} for t in self.wrong],
            "trials": [t.to_dict() for t in self.trials],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "BucketResult":
        def cfg(x):
            return None if x is None else KernelConfig.from_dict(x)
        r = cls(int(d["ctx"]), int(d["tree_nodes"]), cfg(d.get("config")), d.get("time_us"),
                cfg(d.get("default_config")), d.get("default_us"), d.get("floor_us"))
        r.trials = [Trial(KernelConfig.from_dict(t["config"]), t["phase"], t.get("time_us"), t.get("error"),
                          bool(t.get("wrong"))) for t in d.get("trials", [])]
        return r


ProgressFn = Callable[[Trial, "BucketResult"], None]


def estimate_trials(n_tiles: int, grid_len: int, top_tiles: int = 2, refine_rounds: int = 2) -> int:
    """Upper bound of timed configs for one bucket (for a progress bar's total)."""
    k = min(top_tiles, n_tiles)
    return n_tiles + k * grid_len + k * 2 * refine_rounds + 1


def tune_bucket(
    tiles: list[KernelConfig],
    *,
    ctx: int,
    tree_nodes: int,
    splits_for: Callable[[KernelConfig], list[int]],
    heuristic_for: Callable[[KernelConfig], int],
    timer: Timer,
    checker: Checker,
    cap_for: Optional[Callable[[KernelConfig], int]] = None,
    default_config: Optional[KernelConfig] = None,
    floor_us: Optional[float] = None,
    top_tiles: int = 2,
    refine_rounds: int = 2,
    on_trial: Optional[ProgressFn] = None,
) -> BucketResult:
    """Search one bucket; `tiles` have num_splits=0 and already passed pruning.

    `cap_for(tile)` bounds the split counts the refine phase may walk out to
    (default: the largest point of the tile's coarse grid).
    """
    res = BucketResult(ctx, tree_nodes, default_config=default_config, floor_us=floor_us)
    seen: dict[KernelConfig, Trial] = {}

    def evaluate(cfg: KernelConfig, phase: str) -> Trial:
        if cfg in seen:
            return seen[cfg]
        t: Optional[Trial] = None
        try:
            why = checker(cfg)
            if why:
                t = Trial(cfg, phase, None, f"wrong output: {why}", wrong=True)
        except Exception as e:  # a launch failure is a failed config, not a crash of the tuner
            t = Trial(cfg, phase, None, f"check raised {type(e).__name__}: {e}")
        if t is None:
            try:
                us = float(timer(cfg))
                t = Trial(cfg, phase, us) if math.isfinite(us) and us > 0 else Trial(cfg, phase, None,
                                                                                    f"timer returned {us}")
            except Exception as e:
                t = Trial(cfg, phase, None, f"timing raised {type(e).__name__}: {e}")
        seen[cfg] = t
        res.trials.append(t)
        if t.time_us is not None and (res.best_us is None or t.time_us < res.best_us):
            res.best, res.best_us = cfg, t.time_us
        if on_trial is not None:
            on_trial(t, res)
        return t

    # 1. each tile at its heuristic split count
    tile_time: dict[KernelConfig, float] = {}
    for tile in tiles:
        t = evaluate(tile.replace(num_splits=heuristic_for(tile)), "tiles")
        if t.time_us is not None:
            tile_time[tile] = t.time_us
    ranked = sorted(tile_time, key=tile_time.__getitem__)[:max(1, top_tiles)]

    # 2. coarse split grid for the best tiles; 3. refine around each tile's best split
    for tile in ranked:
        grid = splits_for(tile)
        for s in grid:
            evaluate(tile.replace(num_splits=s), "splits")
        for _ in range(refine_rounds):
            timed = {c.num_splits: t.time_us for c, t in seen.items()
                     if t.time_us is not None and c.replace(num_splits=0) == tile and t.phase != "default"}
            if not timed:
                break
            best_s = min(timed, key=timed.__getitem__)
            tried = {c.num_splits for c in seen if c.replace(num_splits=0) == tile}
            pts = refine_points(grid, best_s, tried, hi=cap_for(tile) if cap_for else max(grid))
            if not pts:
                break
            for s in pts:
                evaluate(tile.replace(num_splits=s), "refine")

    # 4. the default, for the gain (a default that was already timed is reused)
    if default_config is not None:
        t = seen.get(default_config) or evaluate(default_config, "default")
        res.default_us = t.time_us
    return res
