"""Every prediction as a band: the central value, a low-high range from the constants' stated ranges, and the
constant that moves it most.

Each ranged constant of the device (devices.Const.lo / .hi) is moved to each end of its range alone, with
the call's split count held (the config is the caller's), and the call predicted again. The band is the
central value minus / plus the root-sum-square of the one-at-a-time moves below / above it (the constants'
errors taken as independent); `sensitive` names the constant whose range moves the prediction most. A kernel
change smaller than the band is within model uncertainty: `compare()` says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from . import call as predict
from .devices import Const, DeviceModel
from .kernels import KernelModel


@dataclass
class Band:
    central: float
    low: float
    high: float
    sensitive: str                      # the constant whose range moves the prediction most
    swings: dict[str, tuple[float, float]]  # constant -> (prediction at its low end, at its high end)

    def to_dict(self) -> dict:
        return {"central_us": round(self.central, 2), "low_us": round(self.low, 2), "high_us": round(self.high, 2),
                "sensitive": self.sensitive,
                "swings_us": {k: [round(a, 2), round(b, 2)] for k, (a, b) in self.swings.items()}}

    def text(self) -> str:
        return f"{self.central:.1f} [{self.low:.0f}-{self.high:.0f}]"


def ranged_constants(dev: DeviceModel) -> dict[str, Const]:
    return {k: v for k, v in dev.__dict__.items() if isinstance(v, Const) and v.ranged}


def band(km: KernelModel, dev: DeviceModel, case: predict.Case, num_splits: Optional[int] = None,
         central: Optional[predict.Prediction] = None) -> Band:
    c = central or predict.predict(km, dev, case, num_splits)
    splits = c.num_splits
    swings: dict[str, tuple[float, float]] = {}
    for name, const in ranged_constants(dev).items():
        lo, hi = const.range
        at = [predict.predict(km, replace(dev, **{name: const.at(v)}), case, splits).total_us for v in (lo, hi)]
        swings[name] = (at[0], at[1])
    down = math.sqrt(sum(max(0.0, c.total_us - min(a, b)) ** 2 for a, b in swings.values()))
    up = math.sqrt(sum(max(0.0, max(a, b) - c.total_us) ** 2 for a, b in swings.values()))
    sensitive = max(swings, key=lambda k: abs(swings[k][1] - swings[k][0])) if swings else "-"
    return Band(c.total_us, c.total_us - down, c.total_us + up, sensitive, swings)


def compare(before: Band, after: Band) -> str:
    """'gain', 'loss' or 'within model uncertainty': a change smaller than half the before-band's width is not
    a gain (nor a loss), whatever its sign."""
    d = after.central - before.central
    if abs(d) < (before.high - before.low) / 2:
        return "within model uncertainty"
    return "gain" if d < 0 else "loss"
