"""The main job's model table: each reading with its kernel, --validate's verdict on that kernel, and the last
committed measurement of the same shape beside it (bench/benchmark/measured.py, bench/benchmark/report.py; issue 43 items 1 and 3)."""
import io
import json

import pytest

from bench.benchmark import measured as bm
from bench.benchmark.report import print_report
from verify_attn import build as vb

KIMI = {"name": "kimi-k2-tp8", "hq": 8, "hkv": 1, "dqk": 576, "dv": 512, "sm_scale": 0.1147, "mla": True}
V2 = {"num_splits": 66, "block_n": 32, "block_m": 64, "num_warps": 8, "num_stages": 3}
V1 = {"num_splits": 33, "block_n": 32, "block_m": 32, "num_warps": 8, "num_stages": 4}


def _payload(date, rows, shape=KIMI, kv="bf16", device="NVIDIA H200"):
    return {"device": device, "date": date, "shape": shape, "dtype": "bf16", "kv_dtype": kv, "batch": 1,
            "tree_shape": "ddtree",
            "results": [{"backend": b, "ctx": 185000, "tree_nodes": 16, "layout": "page1", "page_size": 1,
                         "status": "ok", "median_us": us, "config": cfg} for b, us, cfg in rows]}


@pytest.fixture
def results(tmp_path, monkeypatch):
    root = tmp_path / "bench" / "results"
    (root / "h200").mkdir(parents=True)
    (root / "h200-run2").mkdir()
    monkeypatch.setattr(bm, "REPO", tmp_path)
    monkeypatch.setattr(bm, "RESULTS", root)
    return root


def test_last_measured_takes_the_latest_run_per_kernel_and_names_its_file(results):
    old = _payload("2026-12-04T16:37:39", [("cuda@v2", 315.5, V2), ("cuda@v1", 278.5, V1)])
    new = _payload("2026-12-04T16:48:58", [("cuda@v2", 315.3, V2), ("cuda@v1", 277.4, V1),
                                           ("cuda@v0", 0.0, None), ("triton", 671.2, V1)])
    (results / "h200" / "headline.json").write_text(json.dumps(old))
    (results / "h200-run2" / "headline.json").write_text(json.dumps(new))
    (results / "h200-run2" / "verify_runs.jsonl").write_text(json.dumps(new) + "\n")   # the same run, appended
    (results / "h200" / "gqa.json").write_text(json.dumps(_payload("2026-12-05T00:00:00", [("cuda", 1.0, V1)],
                                                                   shape={**KIMI, "hkv": 8, "mla": False})))
    (results / "h200" / "fp8.json").write_text(json.dumps(_payload("2026-12-05T00:00:00", [("cuda", 2.0, V1)],
                                                                   kv="fp8_e4m3")))
    got = bm.last_measured(KIMI, "bf16", "bf16", 185000, 16, "page1", 1)
    assert list(got) == ["h200"]
    assert got["h200"] == [   # fastest first; triton and a row without a config are no cuda kernel measurement
        {"kernel": "v1 m32n32w8s4", "backend": "cuda@v1", "us": 277.4, "date": "2026-12-04",
         "file": "bench/results/h200-run2/headline.json"},
        {"kernel": "v2 m64n32w8s3", "backend": "cuda@v2", "us": 315.3, "date": "2026-12-04",
         "file": "bench/results/h200-run2/headline.json"}]
    assert bm.last_measured(KIMI, "bf16", "bf16", 4000, 16, "page1", 1) == {}
    assert bm.measured_devices() == {"h200": "NVIDIA H200"}


def test_model_kernel_labels_and_verdicts():
    assert bm.model_kernel_label("split bf16 576x512 page1 v2 m64 n32 w8 s3 wg2 wgmma") == "v2 m64n32w8s3"
    # v0's names carry no version; sm_120's v3 (a producer on v1's math) and Hopper's v3 are two kernels
    assert bm.model_kernel_label("split bf16 576x512 page1 m16 n32 w4 s2") == "v0 m16n32w4s2"
    assert bm.model_kernel_label("split bf16 576x512 page1 v3 m32 n16 w20 s4 k2 sn2 producer-wg roles") == \
        "v3-sm120 m32n16w20s4"
    assert bm.model_kernel_label("split bf16 576x512 page1 v3 m128 n64 w12 s2 sm90 seesaw cluster2") == \
        "v3 m128n64w12s2"
    assert vb.label_family("split bf16q-e4m3kv 576x512 page1 v3 m32 n32 w9 s4 k2 sn1 producer") == "v3-sm120"
    assert vb.label_family("no kernel here") is None
    v = {"h200 v2 bf16": {"within": False, "rows": "0/28", "range": "1.53-2.23"},
         "h200 v1 bf16": {"within": True, "rows": "24/25", "range": "0.74-1.04"}}
    assert bm.verdict_text(v, "h200", "v2 m64n32w8s3", "bf16", True) == \
        "NOT VALIDATED: 0/28 v2 rows (meas/model 1.53-2.23)"
    assert bm.verdict_text(v, "h200", "v1 m32n16w8s4", "fp16", True) == "validated: 24/25 v1 rows"
    assert bm.verdict_text(v, "h200", "v2 m64n32w8s4", "fp8_e4m3", True) == "not validated: no v2 e4m3 rows"
    assert bm.verdict_text(v, "rtx-pro-6000", "v1 m32n16w8s4", "bf16", False) == "not validated: never measured"


def _report_payload():
    floors = {"H200": 52.1}
    row = lambda ctx, **kw: {"backend": "reference", "ctx": ctx, "tree_nodes": 16, "layout": "page1", "page_size": 1,
                             "bytes": 4.9e6, "flops": 1.1e9, "floor_us": floors, "floor_bound": {"H200": "compute"},
                             "median_us": None, "p20_us": None, "p80_us": None, "gbs": None, "tflops": None,
                             "frac_of_floor": None, "speedup_vs_serial": None, "max_rel_err": None, "config": None,
                             "status": "counted", "timed_on": None, "note": "", **kw}
    pred = lambda us, kernel, verdict: {"us": us, "low_us": us * 0.9, "high_us": us * 1.1, "bound": "smem",
                                        "frac_of_floor": 52.1 / us, "kernel_label": kernel, "validation": verdict}
    return {"shape": KIMI, "dtype": "bf16", "kv_dtype": "bf16", "kv_row_bytes": 1152, "tree_shape": "ddtree",
            "batch": 1, "device": None, "devices": [{"name": "H200"}], "floor_device": None, "notes": [],
            "results": [row(185000),   # the counted row first, the CPU-timed one after (the order sweep makes)
                        row(4000, median_us=2.3e5, p20_us=2e5, p80_us=3e5, gbs=0.02, tflops=0.005, status="ok",
                            timed_on="cpu")],
            "model": [{"ctx": c, "tree_nodes": 16, "layout": "page1", "page_size": 1, "measured_devices": ["h200"],
                       "predictions": {"rtx-pro-6000": pred(218.5, "v1 m32n16w8s4", "not validated: never measured"),
                                       "h200": pred(148.4, "v2 m64n32w8s3", "NOT VALIDATED: 0/28 v2 rows")},
                       "measured": {} if c == 4000 else {"h200": [
                           {"kernel": "v1 m32n32w8s4", "us": 277.4, "date": "2026-12-04",
                            "file": "bench/results/h200-run2/headline.json"},
                           {"kernel": "v2 m64n32w8s3", "us": 315.3, "date": "2026-12-04",
                            "file": "bench/results/h200-run2/headline.json"}]}}
                      for c in (185000, 4000)]}


def _lines(payload):
    from rich.console import Console
    buf = io.StringIO()
    print_report(payload, console=Console(file=buf, width=400))
    return buf.getvalue().splitlines()


def test_report_prints_measured_beside_model_with_kernels():
    lines = _lines(_report_payload())
    h200 = [ln for ln in lines if "148.4" in ln]
    assert len(h200) == 2
    at185 = next(ln for ln in h200 if "315.3" in ln)   # the model's own kernel's measurement on its line
    assert "v2 m64n32w8s3" in at185 and "NOT VALIDATED: 0/28 v2 rows" in at185 and "2026-12-04" in at185 \
        and "h200-run2/headline.json" in at185
    other = next(ln for ln in lines if "277.4" in ln)
    assert "v1 m32n32w8s4" in other and "148.4" not in other
    assert any("218.5" in ln and "v1 m32n16w8s4" in ln and "no results for this device" in ln for ln in lines)
    assert any("148.4" in ln and "not measured at this shape" in ln for ln in lines)


def test_report_lists_contexts_in_the_same_order_and_says_floor_over_time():
    lines = _lines(_report_payload())
    text = "\n".join(lines)
    assert "% floor" not in text and "floor ÷ time" in text and "floor ÷ model" in text
    ctx_rows = [ln for ln in lines if "185,000" in ln or "4,000" in ln]
    order = ["185" if "185,000" in ln else "4" for ln in ctx_rows]
    floor_order, model_order = order[:2], order[-2:]   # floor table first, model table last
    assert floor_order == model_order == ["4", "185"]


def test_report_cpu_reference_row_has_no_bandwidth_or_flop_rate():
    row = next(ln for ln in _lines(_report_payload()) if "reference (CPU)" in ln)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    # backend, ctx, nodes, layout, median, p20-p80, GB/s, TFLOP/s, floor ÷ time, ...
    assert cells[6] == "-" and cells[7] == "-" and cells[8] == "-", cells


@pytest.mark.slow
def test_verdicts_on_the_committed_results_are_validates():
    """The real thing (a minute of predictions): v2 misses on the H200, v1 holds (bench.model --validate)."""
    v = bm.verdicts(use_cache=False)
    if not v:
        pytest.skip("the model cannot read the kernels here (no CUDA toolkit / SASS tools)")
    assert v["h200 v2 bf16"]["within"] is False and v["h200 v2 bf16"]["rows"].startswith("0/")
    assert v["h200 v1 bf16"]["within"] is True


def test_report_names_the_kernel_of_a_measured_cuda_row():
    p = _report_payload()
    p["results"].append(dict(p["results"][1], backend="cuda@v2", median_us=315.5, timed_on="cuda", config=V2))
    row = next(ln for ln in _lines(p) if ln.lstrip("│ ").startswith("cuda@v2"))
    assert "v2 m64n32w8s3 S66" in row, row


def test_a_measured_row_and_the_models_reading_name_the_same_kernel():
    """Every compiled tile: the label of a measured cuda row that ran it (its config) equals the label of bench.model's
    name for it, so bench.verify pairs the two and --validate files the row under the tile's own kernel (sm_120's v3
    tiles are version-1 tiles with a producer: by version alone they were labelled v1)."""
    for head, tiles in vb.TILES.items():
        for t in tiles:
            row = {"config": {"block_m": t.block_m, "block_n": t.block_n, "num_warps": t.num_warps,
                              "num_stages": t.num_stages}}
            assert bm._row_kernel(row, head) == bm.model_kernel_label(f"split bf16 576x512 page1 {t.label()}"), \
                (head, t.label())
            assert vb.label_family(t.label()) == t.family
