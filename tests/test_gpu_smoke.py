"""The smoke stage of a GPU session (bench/gpu_run/smoke.py) and the quarantine it hands the later stages.

No GPU is needed: the jobs here are small Python children that behave like a healthy, hung, crashed, erroring or
wrong bench.verify (they write its JSON, or sleep, or exit), and the plan is bench.gpu_check's own.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from bench.gpu_run import gpu_check, smoke
from verify_attn import build as vb
from verify_attn.backends import cuda


def _fake_job(tmp: Path, name: str, backend: str, kv: str, body: str, tile=None) -> smoke.Job:
    """A job whose child runs `body` with J (its JSON path) and B (its row backends) defined."""
    jp, lp = tmp / f"{name}.json", tmp / f"{name}.log"
    j = smoke.Job(backend, kv, tile, [], str(jp), str(lp))
    pre = f"import json, os, sys, time; J = {str(jp)!r}; B = {list(j.backends)!r}\n"
    j.argv = [sys.executable, "-c", pre + body]
    return j


def _rows(statuses: list[str], device: str = "NVIDIA H200") -> str:
    return ("rows = [dict(backend=b, ctx=1500, tree_nodes=16, layout='page1', status=s, note='n-' + s, "
            f"max_rel_err=0.001) for b in B for s in {statuses!r}]\n"
            f"json.dump(dict(device={device!r}, results=rows), open(J, 'w'))\n")


def test_smoke_classifies_hangs_crashes_errors_and_wrong_results(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    jobs = [
        _fake_job(tmp_path, "ok", "cuda@v3", "bf16", _rows(["ok", "ok"]), tile="m64n64w12s2"),
        # a hung kernel: the child (and a process it started) never exits; both are killed with the process group
        _fake_job(tmp_path, "hang", "cuda@v3-sm120", "bf16",
                  "import subprocess\n"
                  f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                  f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                  "print('launching the kernel', flush=True); time.sleep(60)\n", tile="m32n16w20s4"),
        _fake_job(tmp_path, "crash", "cuda@m32n16w9s4", "bf16", "print('Segmentation fault'); sys.exit(139)\n",
                  tile="m32n16w9s4"),
        _fake_job(tmp_path, "error", "cuda@v3-sm120", "fp8_e4m3", _rows(["ok", "error"]), tile="m32n32w12s4"),
        _fake_job(tmp_path, "wrong", "cuda@m32n16w12s4", "bf16", _rows(["wrong", "ok"]), tile="m32n16w12s4"),
        _fake_job(tmp_path, "nogpu", "cuda@v3", "fp8_e4m3", _rows(["ok"], device=None)),
        _fake_job(tmp_path, "unsup", "cuda@v3", "fp8_mla656", _rows(["unsupported"])),
        _fake_job(tmp_path, "norows", "cuda@v3", "fp16", "json.dump(dict(device='H200', results=[]), open(J, 'w'))\n"),
    ]
    lines = []
    t0 = time.perf_counter()
    smoke.run_jobs(jobs, timeout_s=3.0, parallel=8, progress=lines.append)
    assert time.perf_counter() - t0 < 15    # the hang cost its timeout, not 60 s
    st = {j.json_path.rsplit("/", 1)[1][:-5]: j for j in jobs}
    assert {k: j.status for k, j in st.items()} == {
        "ok": "ok", "hang": "hang", "crash": "crash", "error": "error", "wrong": "wrong", "nogpu": "no-gpu",
        "unsup": "unsupported", "norows": "crash"}
    assert "launching the kernel" in st["hang"].note and st["hang"].rc is None
    assert "Segmentation fault" in st["crash"].note and st["crash"].rc == 139
    assert "n-error" in st["error"].note and "n-wrong" in st["wrong"].note
    assert len(st["ok"].rows) == 4 and {r[0] for r in st["ok"].rows} == {"cuda@v3", f"cuda@v3:{smoke.MANY_SPLITS}"}
    assert len(lines) == len(jobs) and any("hang" in x for x in lines)
    # the grandchild of the hung job went with its process group
    gpid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(gpid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the hung job's grandchild outlived the kill")
    # hangs, crashes and errors are quarantined by version and by tile (an fp16 cache as bf16: the same tiles); a
    # wrong result is not
    assert smoke.quarantine_of(jobs) == ["m32n16w20s4/bf16", "m32n16w9s4/bf16", "m32n32w12s4/fp8_e4m3",
                                         "v3-sm120/bf16", "v3-sm120/fp8_e4m3", "v3/bf16"]
    rec = smoke.write_json(jobs, tmp_path / "smoke.json", 3.0)
    assert smoke.load_quarantine(tmp_path / "smoke.json") == rec["quarantine"]
    assert smoke.load_quarantine(tmp_path / "missing.json") == []


def test_smoke_jobs_name_the_tiles_their_versions_pin():
    jobs = smoke.make_jobs(["cuda@v3-sm120", "cuda@v3", "cuda@m32n16w9s4/bf16"], ["bf16", "fp8_e4m3"],
                           Path("/tmp/s"), arch="sm_90a")
    got = [(j.backend, j.kv_dtype, j.tile) for j in jobs]
    roles = cuda.tile_name(cuda.v3_sm120_tile("mla576", "sm_90a"))
    roles_e4m3 = cuda.tile_name(cuda.v3_sm120_tile("mla576e4m3", "sm_90a"))
    assert got == [("cuda@v3-sm120", "bf16", roles), ("cuda@v3", "bf16", cuda.tile_name(vb.V3_SM90_TILE)),
                   ("cuda@v3-sm120", "fp8_e4m3", roles_e4m3), ("cuda@v3", "fp8_e4m3", cuda.tile_name(vb.V3_SM90_TILE)),
                   ("cuda@m32n16w9s4", "bf16", "m32n16w9s4")]
    assert (roles, roles_e4m3) == ("m32n16w20s4", "m32n32w20s4")
    assert jobs[0].quarantine_keys() == ["v3-sm120/bf16", "m32n16w20s4/bf16"]
    assert jobs[-1].quarantine_keys() == ["m32n16w9s4/bf16"]   # a tile-named job: one entry
    a = jobs[2].argv
    assert a[a.index("--backend") + 1] == f"cuda@v3-sm120,cuda@v3-sm120:{smoke.MANY_SPLITS}"
    assert a[a.index("--kv-dtype") + 1] == "fp8_e4m3" and "--json" in a and "--no-model" in a
    # on the RTX, as on the H200, the sm_120 pin is the math-roles tile for e4m3 too
    assert smoke.make_jobs(["cuda@v3-sm120"], ["fp8_e4m3"], Path("/tmp/s"), arch="sm_120a")[0].tile == "m32n32w20s4"
    assert smoke.tile_of("triton", "bf16", "sm_90a") is None and smoke.tile_of("cuda", "bf16", "sm_90a") is None


def test_pinned_tile_agrees_with_version_config():
    """cuda.pinned_tile (no problem needed) names the tile version_config resolves, for every pinned name and a tile;
    where it names none, version_config refuses the name."""
    from cases import CaseSpec, make_case
    mla = dict(hq=8, hkv=1, dqk=576, dv=512, mla=True)
    for kv, head in (("", "mla576"), ("fp8_e4m3", "mla576e4m3")):
        p = make_case(CaseSpec((97,), (16,), "bushy", dtype=torch.bfloat16, kv_dtype=kv, seed=5, **mla)).problem()
        for name in (*cuda.PINNED_NAMES, "m32n16w9s4", "v3:7"):
            if kv and name == "m32n16w9s4":
                name = "m32n32w9s4"
            t = cuda.pinned_tile(head, "sm_90a", name)   # a CPU reads the H200's arch
            if t is None:   # e.g. no v0 tile for e4m3 rows: version_config refuses the name too
                with pytest.raises(LookupError):
                    cuda.version_config(p, name)
                continue
            assert cuda.tile_name(cuda.version_config(p, name)) == cuda.tile_name(t), (head, name)
    assert cuda.pinned_tile("mla576", "sm_90a", "m99n16w9s4") is None
    assert cuda.pinned_tile("mla576", "sm_90a", "v9") is None


def test_quarantine_env_is_read_by_the_tests_and_the_tuner(monkeypatch):
    from verify_attn.shapes import get_shape
    monkeypatch.delenv(cuda.QUARANTINE_ENV, raising=False)
    shape = get_shape("kimi-k2-tp8")
    every = [cuda.tile_name(c) for c in cuda.config_space(shape, "sm_90a")]
    assert cuda.quarantined("m32n16w20s4") is None and "m32n16w20s4" in every
    monkeypatch.setenv(cuda.QUARANTINE_ENV, "v3-sm120/bf16, m32n16w20s4/bf16,m64n64w12s2/fp8_e4m3")
    why = cuda.quarantined("m32n16w20s4", "fp16")   # 16-bit caches share their tiles
    assert why and "m32n16w20s4/bf16" in why and "smoke" in why
    assert cuda.quarantined("v3-sm120", "") and cuda.quarantined("v3-sm120", "fp8_e4m3") is None
    assert cuda.quarantined("m64n64w12s2") is None and cuda.quarantined("m64n64w12s2", "fp8_e4m3")
    left = [cuda.tile_name(c) for c in cuda.config_space(shape, "sm_90a")]
    assert "m32n16w20s4" not in left and set(every) - set(left) == {"m32n16w20s4"}
    e4m3 = [cuda.tile_name(c) for c in cuda.config_space(shape, "sm_90a", kv_dtype="fp8_e4m3")]
    assert "m64n64w12s2" not in e4m3 and e4m3


def test_gpu_check_quarantines_the_later_stages():
    a = gpu_check._parser().parse_args(["--knockout"])
    stages = {s.name: s for s in gpu_check.plan(Path("/tmp/o"), a)}
    names = list(stages)
    assert names.index("smoke") == names.index("build") + 1 < names.index("tests")
    sm = stages["smoke"].argv
    assert sm[sm.index("--backend") + 1].split(",") == list(gpu_check.SMOKE_BACKENDS)
    assert set(gpu_check.SMOKE_STEMS) <= set(gpu_check.jit_set_of([stages["smoke"]]))
    q = {"v3-sm120/bf16", "m32n16w20s4/bf16", "v3/fp8_e4m3"}
    for s in stages.values():
        gpu_check.quarantine_stage(s, q)

    def items(name, flag="--backend"):
        argv = stages[name].argv
        return argv[argv.index(flag) + 1].split(",")

    assert gpu_check.V3 not in items("headline") and gpu_check.V3H in items("headline")
    assert stages["headline"].extra["quarantined"] == [gpu_check.V3]
    assert not any(b.startswith(gpu_check.V3) for b in items("splits")) and f"{gpu_check.V3H}:15" in items("splits")
    assert gpu_check.V3 in items("fp8") and gpu_check.V3H not in items("fp8")   # e4m3: the other way round
    assert "v3-sm120" not in items("knockout", "--versions") and "v3" in items("knockout", "--versions")
    ncu = stages["ncu"].argv
    kept = items("ncu", "--versions")
    assert "v3-sm120" not in kept and len(kept) == len(gpu_check.NCU_VERSIONS) - 1
    assert ncu[ncu.index("--launch-skip") + 1] == ncu[ncu.index("-c") + 1] == str(len(kept))
    assert stages["smoke"].argv == sm and stages["peers"].extra == {}
    # a GPU test that hangs leaves its stack in the stage's log before the cap kills the stage
    assert all("faulthandler_timeout=20" in s.argv for s in stages.values() if "pytest" in s.argv)
    # a stage whose every backend is quarantined is skipped, and says why
    st = gpu_check.Stage("x", ["python", "-m", "bench.verify", "--backend", "cuda@v3-sm120:15,cuda@v3-sm120"],
                         cap_s=10, min_s=1)
    gpu_check.quarantine_stage(st, q)
    gpu_check.run_stage(st, Path("/tmp"), 100)
    assert st.status.startswith("skipped") and "quarantined" in st.status


def test_gpu_check_hands_the_quarantine_to_every_later_stage(tmp_path, monkeypatch):
    """Through main: the smoke stage's smoke.json sets VERIFY_ATTN_QUARANTINE for the stages after it (the pytest
    stages read it) and drops the quarantined backends from their argv."""
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.delenv(cuda.QUARANTINE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(gpu_check, "_pack", lambda out: None)
    write = json.dumps({"quarantine": ["v3-sm120/bf16", "m32n16w20s4/bf16"], "jobs": []})
    show = "import os, sys; print('Q=' + os.environ.get('VERIFY_ATTN_QUARANTINE', '')); print('ARGV=' + sys.argv[-1])"
    monkeypatch.setattr(gpu_check, "plan", lambda out, a: [
        gpu_check.Stage("before", [sys.executable, "-c", show, "--backend", "cuda@v3-sm120,cuda@v1"], cap_s=20,
                        min_s=1),
        gpu_check.Stage("smoke", [sys.executable, "-c", f"open({str(tmp_path / 'smoke.json')!r}, 'w').write({write!r})"],
                        cap_s=20, min_s=1),
        gpu_check.Stage("after", [sys.executable, "-c", show, "--backend", "cuda@v3-sm120,cuda@v1"], cap_s=20,
                        min_s=1),
    ])
    assert gpu_check.main(["--budget-s", "60"]) == 0
    before, after = (tmp_path / "before.log").read_text(), (tmp_path / "after.log").read_text()
    assert "Q=\n" in before and "ARGV=cuda@v3-sm120,cuda@v1" in before
    assert "Q=m32n16w20s4/bf16,v3-sm120/bf16" in after and "ARGV=cuda@v1" in after
    rec = json.loads((tmp_path / "gpu_check.json").read_text())
    assert next(s for s in rec["stages"] if s["name"] == "after")["extra"]["quarantined"] == ["cuda@v3-sm120"]


def test_smoke_cli_refuses_bad_arguments(capsys):
    for argv in (["--backend", "", "--json", "/tmp/x.json"], ["--backend", "cuda@v3", "--kv-dtype", "fp9",
                                                            "--json", "/tmp/x.json"],
                 ["--backend", "cuda@v3/fp9", "--json", "/tmp/x.json"],
                 ["--backend", "cuda@v3", "--timeout-s", "0", "--json", "/tmp/x.json"]):
        with pytest.raises(SystemExit) as e:
            smoke.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "fp9" in err and "--timeout-s" in err


def test_the_short_table_says_what_the_smoke_stage_found(tmp_path):
    from bench.gpu_run.gpu_results import smoke_line
    assert smoke_line(tmp_path) is None
    jobs = [smoke.Job("cuda@v3", "bf16", "m64n64w12s2", [], "", "", status="ok"),
            smoke.Job("cuda@v3-sm120", "bf16", "m32n16w20s4", [], "", "", status="hang"),
            smoke.Job("cuda@m32n16w9s4", "fp16", "m32n16w9s4", [], "", "", status="ok")]
    smoke.write_json(jobs, tmp_path / "smoke.json", 20.0)
    line = smoke_line(tmp_path)
    assert line == ("smoke ok: v3/bf16 (m64n64w12s2), m32n16w9s4/bf16; hang: v3-sm120/bf16 (m32n16w20s4); "
                    "quarantined for the rest of the run: m32n16w20s4/bf16, v3-sm120/bf16")
