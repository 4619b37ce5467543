"""--plot: GB/s and fraction of the roofline floor against context length, per backend (peers dotted)."""
from __future__ import annotations

from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402


def plot_results(payload: dict, path: str) -> None:
    rows = payload["results"]
    floor_dev = payload.get("floor_device")
    # the floor of the GPU at hand only (else every reference device): one dashed line per tree/layout
    devs = [floor_dev] if floor_dev else [d["name"] for d in payload["devices"]]
    fig, (ax_bw, ax_frac) = plt.subplots(1, 2, figsize=(13, 5), sharex=True)

    # the floor drawn as the bandwidth a call at the floor would show: bytes / floor time
    floors: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        floors[(r["tree_nodes"], r["layout"], r["page_size"])][r["ctx"]] = r
    for (nodes, lay, ps), by_ctx in sorted(floors.items()):
        xs = sorted(by_ctx)
        for d in devs:
            ys = [by_ctx[x]["bytes"] / (by_ctx[x]["floor_us"][d] * 1e3) for x in xs]
            ax_bw.plot(xs, ys, linestyle="--", linewidth=1, color="0.4",
                       label=f"floor {d} ({nodes} nodes, {lay if ps == 1 else f'paged{ps}'})")

    series: dict[tuple, list] = defaultdict(list)
    for r in rows:
        if r["timed_on"] == "cuda" and r["median_us"]:
            series[(r["backend"], r["tree_nodes"], r["layout"], r["page_size"])].append(r)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((b, nodes, lay, ps), rs) in enumerate(sorted(series.items())):
        rs.sort(key=lambda r: r["ctx"])
        lab = f"{b} ({nodes} nodes, {lay if ps == 1 else f'paged{ps}'})"
        style = dict(marker="o", label=lab, color=colors[i % len(colors)],   # same color in both panels
                     linestyle=":" if rs[0].get("peer") else "-")               # a peer's kernel: dotted
        ax_bw.plot([r["ctx"] for r in rs], [r["gbs"] for r in rs], **style)
        if floor_dev:
            ax_frac.plot([r["ctx"] for r in rs], [r["frac_of_floor"] for r in rs], **style)

    ax_bw.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="GB/s (compulsory bytes / time)",
              title="achieved bandwidth vs floor")
    ax_frac.axhline(1.0, color="k", linewidth=1, linestyle="--", label="floor")
    fracs = [r["frac_of_floor"] for rs in series.values() for r in rs if r["frac_of_floor"] is not None]
    ax_frac.set(xscale="log", xlabel="context length (tokens)", ylabel="fraction of floor (floor time / time)",
                title=f"fraction of floor ({floor_dev or 'no GPU timing'})", ylim=(0, max([1.1, *fracs]) * 1.05))
    if not series:
        ax_frac.text(0.5, 0.5, "no GPU timings in this run", ha="center", va="center", transform=ax_frac.transAxes)
    for ax in (ax_bw, ax_frac):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    s = payload["shape"]
    fig.suptitle(f"tree verify, {s['name']}, {payload['dtype']}, device {payload['device'] or 'none'}, "
                 f"commit {payload['commit'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
