"""Tables (rich) and CSV for bench.verify results."""
from __future__ import annotations

import csv
from typing import Optional

try:  # rich is optional: the GPU machine may not have it, and the table must still print
    from rich.console import Console
    from rich.table import Table
except ImportError:
    Console = Table = None  # type: ignore[assignment,misc]


class _PlainTable:
    """The subset of rich.table.Table used here, printed as aligned plain text."""

    def __init__(self, title: str = ""):
        self.title, self.cols, self.rows, self.right = title, [], [], []

    def add_column(self, name: str, justify: str = "left") -> None:
        self.cols.append(name.replace("\n", " "))
        self.right.append(justify == "right")

    def add_row(self, *cells: str) -> None:
        self.rows.append([str(c) for c in cells])

    def __str__(self) -> str:
        w = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c) for i, c in enumerate(self.cols)]
        fmt = lambda cells: "  ".join(c.rjust(w[i]) if self.right[i] else c.ljust(w[i]) for i, c in enumerate(cells))
        return "\n".join([self.title, fmt(self.cols), "  ".join("-" * x for x in w), *map(fmt, self.rows)])


class _PlainConsole:
    def print(self, obj) -> None:
        print(obj if isinstance(obj, str) else str(obj))


def _table(title: str):
    return Table(title=title) if Table is not None else _PlainTable(title)


def _us(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if x < 1e4 else f"{x:,.0f}"


# KernelConfig fields in the table: S4 BN32 BM64 W4 ST2 (S0 = the backend's split heuristic)
_CFG_ABBR = {"num_splits": "S", "block_n": "BN", "block_m": "BM", "num_warps": "W", "num_stages": "ST"}


def _key(r: dict) -> tuple:
    return (r["ctx"], r["tree_nodes"], r["layout"], r["page_size"])


def print_report(payload: dict, console: Optional[Console] = None) -> None:
    con = console or (Console(width=200) if Console is not None else _PlainConsole())
    rows = payload["results"]
    shape = payload["shape"]
    con.print(f"tree-verify {shape['name']} (hq {shape['hq']}, hkv {shape['hkv']}, "
              f"{shape['dqk']}/{shape['dv']}{', MLA' if shape['mla'] else ''}), {payload['dtype']}, "
              f"KV {payload.get('kv_dtype', payload['dtype'])} ({payload.get('kv_row_bytes', '?')} B per token per KV head), "
              f"tree {payload['tree_shape']}, batch {payload['batch']}, device: {payload['device'] or 'none (CPU)'}")

    devs = [d["name"] for d in payload["devices"]]
    t = _table("compulsory traffic and roofline floor per call (k = 1,000 tokens)")
    for c in ("ctx", "nodes", "layout", "MB", "GFLOP", "FLOP/B"):
        t.add_column(c, justify="right")
    for d in devs:
        t.add_column(f"floor us\n{d}", justify="right")
    seen = set()
    for r in sorted(rows, key=_key):   # contexts ascending, as in the model table
        if _key(r) in seen:
            continue
        seen.add(_key(r))
        lay = r["layout"] if r["page_size"] == 1 else f"paged{r['page_size']}"
        cells = [f"{r['ctx']:,}", str(r["tree_nodes"]), lay, f"{r['bytes'] / 1e6:,.2f}", f"{r['flops'] / 1e9:,.2f}",
                 f"{r['flops'] / r['bytes']:,.0f}"]
        cells += [f"{_us(r['floor_us'][d])} ({r['floor_bound'][d][0].upper()})" for d in devs]
        t.add_row(*cells)
    con.print(t)
    con.print("  (M) memory-bound, (C) compute-bound. Bytes: KV rows once + q + out + ids + mask; "
              "split workspaces not counted.")

    timed = [r for r in rows if r["status"] != "counted"]
    if timed:
        m = _table(f"measured ({'GPU' if payload['device'] else 'CPU'}); floor device: "
                        f"{payload.get('floor_device') or '-'}")
        for c in ("backend", "ctx", "nodes", "layout", "median us", "p20-p80", "GB/s", "TFLOP/s", "floor ÷ time",
                  "x serial", "max rel err", "config", "status"):
            m.add_column(c, justify="left" if c in ("backend", "config", "status") else "right")
        head = _head(payload)
        for r in sorted(timed, key=_key):
            cfg = r["config"]
            gpu = r["timed_on"] == "cuda"   # a CPU wall-clock time has no meaningful GB/s or TFLOP/s
            cfg_s = "-" if not cfg else " ".join(f"{_CFG_ABBR.get(k, k)}{v}" for k, v in cfg.items())
            if cfg and r["backend"].partition("@")[0] == "cuda":   # name the compiled kernel: v2 m64n32w8s3 S66
                from bench.benchmark.measured import _row_kernel
                k = _row_kernel(r, head)
                cfg_s = f"{k} S{cfg.get('num_splits')}" if k else cfg_s
            lay = r["layout"] if r["page_size"] == 1 else f"paged{r['page_size']}"
            frac = r["frac_of_floor"]
            m.add_row(
                r["backend"] + (" (CPU)" if r["timed_on"] == "cpu" else ""), f"{r['ctx']:,}", str(r["tree_nodes"]), lay,
                _us(r["median_us"]),
                f"{_us(r['p20_us'])}-{_us(r['p80_us'])}" if r["p20_us"] is not None else "-",
                f"{r['gbs']:,.0f}" if gpu and r["gbs"] is not None else "-",
                f"{r['tflops']:,.1f}" if gpu and r["tflops"] is not None else "-",
                f"{100 * frac:.3g}%" if frac is not None else "-",
                f"{r['speedup_vs_serial']:.1f}x" if r["speedup_vs_serial"] else "-",
                f"{r['max_rel_err']:.1e}" if r["max_rel_err"] is not None else "-",
                cfg_s, r["status"] + (f": {r['note']}" if r["note"] and r["status"] != "ok" else ""),
            )
        con.print(m)
        if any(r["timed_on"] == "cpu" for r in timed):
            con.print("  (CPU) rows are CPU wall-clock times (the float64 reference), not GPU kernel timings.")
    _print_peers(con, rows)
    model = payload.get("model") or []
    if model:
        _print_model(con, model)
    for n in payload.get("notes", []):
        con.print(f"  note: {n}")


def _print_peers(con, rows: list[dict]) -> None:
    """The peers beside our best kernel: time, fraction of the floor, ratio, each pass apart, provenance."""
    peers = [r for r in rows if r.get("peer") and r["status"] != "counted"]
    if not peers:
        return
    t = _table("peers (serving engines' kernels) beside our best kernel, same inputs and timing")
    for c in ("backend", "ctx", "nodes", "layout", "median us", "% floor", "x our best", "passes us", "source",
              "status"):
        t.add_column(c, justify="left" if c in ("backend", "passes us", "source", "status") else "right")
    for r in peers:
        lay = r["layout"] if r["page_size"] == 1 else f"paged{r['page_size']}"
        x = r.get("x_best_ours")
        parts = r.get("parts_us") or {}
        p = r["peer"]
        src = f"{p.get('source')} {p.get('version') or ''} {(p.get('commit') or '')[:10]}".strip()
        t.add_row(r["backend"], f"{r['ctx']:,}", str(r["tree_nodes"]), lay, _us(r["median_us"]),
                  f"{100 * r['frac_of_floor']:.3g}%" if r["frac_of_floor"] is not None else "-",
                  f"{x:.2f}x {r['best_ours']}" if x else "-",
                  " ".join(f"{k} {_us(v)}" for k, v in parts.items()) or "-", src,
                  r["status"] + (f": {r['note']}" if r["note"] and r["status"] != "ok" else ""))
    con.print(t)
    for b, dep in dict.fromkeys((r["backend"], r["departure"]) for r in peers if r.get("departure")):
        con.print(f"  {b} departs from the contract: {dep}")
    con.print("  x our best: the peer's time over our fastest kernel's on the same row (> 1: ours is faster); "
              "passes: each pass of a peer timed alone (flashmla's prefix pass: the speed of light for the prefix)")


def _head(payload: dict) -> Optional[str]:
    """The compiled-kernel family (verify_attn.build.head_key) of the payload's shape and cache format."""
    try:
        from verify_attn import build as vb
        sh, kv = payload["shape"], payload.get("kv_dtype") or payload.get("dtype", "")
        return vb.head_key(sh["dqk"], sh["dv"], sh["mla"], kv if kv.startswith("fp8") else False)
    except (ImportError, KeyError):
        return None


def _print_model(con, model: list[dict]) -> None:
    """The model's reading of each modelled device beside the last committed measurement of the same shape on
    every device with results (bench/results/), each with its kernel; a reading --validate does not back says so."""
    mdevs = list(dict.fromkeys([d for m in model for d in m["predictions"]] +
                               [d for m in model for d in m.get("measured_devices", [])]))
    mt = _table("model (predicted from the kernels' SASS, python -m bench.model) beside the last measurement "
                "(bench/results/)")
    esc = "\\[" if Table is not None else "["   # rich reads [..] as markup
    for c in ("ctx", "nodes", "layout", "device", "model: kernel", f"model us {esc}band] (bound)", "floor ÷ model",
              "--validate (within +-25%)", "measured: kernel", "measured us", "date", "file (bench/results/)"):
        mt.add_column(c, justify="right" if c in ("ctx", "nodes", "measured us", "floor ÷ model") else "left")
    for m in sorted(model, key=_key):
        lay = m["layout"] if m["page_size"] == 1 else f"paged{m['page_size']}"
        first = True
        for d in mdevs:
            p = m["predictions"].get(d)
            meas = list((m.get("measured") or {}).get(d, []))
            same = next((x for x in meas if p and x["kernel"] == p.get("kernel_label")), None)
            meas = ([same] if same else []) + [x for x in meas if x is not same]
            lead = [f"{m['ctx']:,}", str(m["tree_nodes"]), lay] if first else ["", "", ""]
            first = False
            if p:
                band = f" [{p['low_us']:.0f}-{p['high_us']:.0f}]" if "low_us" in p else ""
                mcells = [p.get("kernel_label", "?"), f"{_us(p['us'])}{band} ({p['bound']})",
                          f"{100 * p['frac_of_floor']:.0f}%", p.get("validation", "not validated")]
            else:
                mcells = ["-", "-", "-", "no model reading"]
            if not meas:
                why = "not measured at this shape" if d in m.get("measured_devices", []) else \
                    "no results for this device"
                mt.add_row(*lead, d, *mcells, "-", "-", "-", why)
                continue
            for i, x in enumerate(meas):
                mt.add_row(*(lead + [d] + mcells if i == 0 else [""] * 8), x["kernel"], _us(x["us"]), x["date"],
                           x["file"].removeprefix("bench/results/"))
    con.print(mt)
    con.print(f"  model: the cuda backend's default kernel on that device; {esc}low-high]: the band from the model "
              "constants' stated ranges (bench/model/bands.py): a kernel change smaller than it is within model "
              "uncertainty. floor ÷ model: the device's floor (H200: at the mma.sync-class tensor rate for mma.sync "
              "kernels, at the datasheet rate for the wgmma kernel v2) over the reading. --validate: the model "
              "against that kernel's committed H200 rows (how many within +-25%); `python -m bench.model --per-tile` "
              "explains each number. measured: the median of the latest committed bench.verify run per kernel "
              "(CUDA graph, cold L2), the model's kernel first.")


CSV_FIELDS = ("backend", "ctx", "tree_nodes", "layout", "page_size", "bytes", "flops", "median_us", "p20_us",
              "p80_us", "gbs", "tflops", "frac_of_floor", "floor_device", "speedup_vs_serial", "max_rel_err",
              "status", "timed_on", "note")


def write_csv(payload: dict, path: str) -> None:
    devs = [d["name"] for d in payload["devices"]]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "commit", "date", *CSV_FIELDS, *(f"floor_us[{d}]" for d in devs),
                    *(f"floor_bound[{d}]" for d in devs), "config"])
        for r in payload["results"]:
            w.writerow([payload["device"] or "cpu", payload["commit"], payload["date"],
                        *(r[k] for k in CSV_FIELDS), *(r["floor_us"][d] for d in devs),
                        *(r["floor_bound"][d] for d in devs), r["config"] or ""])
