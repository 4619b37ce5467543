"""Bad command-line input ends in one line `prog: error: ...` naming the flag and what it expects, with
status 2, before anything is allocated or built (issue 43, item 2). One test per refusal."""
from pathlib import Path

import pytest

from bench.gpu_run import gpu_check
from bench.benchmark import verify as bv


def _one_line_error(capsys, main, argv, prog, msg):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert e.value.code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: ") and msg in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv,msg", [
    (["--tree", "10000"], "--tree 10000: at most 256 nodes per request"),
    (["--tree", "16,257"], "--tree 257: at most 256 nodes per request"),
    (["--ctx", "-5k"], "--ctx: not a token count: '-5k'"),          # argparse would say "expected one argument"
    (["--ctx=-5k"], "--ctx: not a token count: '-5k'"),
    (["--batch", "70000"], "--batch 70000: at most 65,535 requests per call"),
    (["--ctx", "3000m"], "--ctx 3,000,000,000: a request's KV length must stay below 2^31 tokens"),
    (["--budget-s", "0"], "--budget-s must be > 0, got 0.0"),
    (["--backend", "cuda@v3:0"], "--backend: kernel version 'v3:0': the split count after ':' must be an integer"),
    (["--backend", "cuda@v9:3"], "--backend: unknown cuda@v9:3"),
    (["--cpu-ctx-cap", "x"], "--cpu-ctx-cap: not a token count: 'x'"),
    (["--serial-max-ctx", "-1k"], "--serial-max-ctx: not a token count: '-1k'"),
    (["--ctx", "500m", "--cpu-ctx-cap", "500m"], "--ctx 500,000,000 --tree 16 --batch 1 (page1) would allocate ~"),
])
def test_bench_verify_refuses(capsys, argv, msg):
    _one_line_error(capsys, bv.main, argv + ["--no-save", "--no-model", "--quiet"], "python -m bench.verify", msg)


def test_bench_verify_memory_estimate_names_the_figure_and_what_is_available(capsys, monkeypatch):
    """The estimate compares with the memory the run would allocate on (here: a machine with 2 GB free)."""
    monkeypatch.setattr(bv, "available_bytes", lambda device: 2e9)
    line = _one_line_error(capsys, bv.main, ["--ctx", "4k", "--batch", "500", "--no-save", "--no-model", "--quiet"],
                           "python -m bench.verify", "--ctx 4,000 --tree 16 --batch 500 (page1) would allocate ~")
    assert "GB on the cpu" in line and "more than the 2.0 GB available" in line and "--cpu-ctx-cap" in line
    # the same run with one request fits: no refusal, it goes on to time the CPU reference
    bv.check_limits(bv.build_parser().parse_args(["--ctx", "4k"]), bv.resolve_shape(bv.build_parser().parse_args([])),
                    [4000], [16], [("page1", 1)], bv.DTYPES["bf16"], [4000], None)


def test_bench_verify_memory_estimate_bounds_the_reference_working_set():
    """A 256-node tree at 4k: the float64 reference's scores dominate (~4 x 2048 rows x 4,352 tokens x 8 B)."""
    shape = bv.resolve_shape(bv.build_parser().parse_args([]))
    b = bv.point_bytes(shape, 4000, 256, 1, 1, 2, 1)
    assert 4 * 2048 * 4256 * 8 < b < 1e9
    assert bv.point_bytes(shape, 185_000, 16, 1, 1, 2, 1) > 2.5 * 185_000 * 1152   # KV pool and its source rows


AUTOTUNE = "python -m autotune"


@pytest.mark.parametrize("argv,msg", [
    (["--ctx", "-5k"], "--ctx: not a token count: '-5k'"),
    (["--tree", "300"], "--tree 300: at most 256 nodes per request"),
    (["--reps", "0"], "--reps must be >= 1, got 0"),
    (["--refine-rounds", "-1"], "--refine-rounds must be >= 0, got -1"),
    (["--max-seconds", "0"], "--max-seconds must be > 0"),
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--build-report", "/nonexistent.json"], "--build-report /nonexistent.json: No such file or directory"),
    (["--json", "/nonexistent/plan.json"], "--json /nonexistent/plan.json: the folder /nonexistent does not exist"),
    (["--arch", "sm_75"], "unknown --arch 'sm_75'"),
])
def test_autotune_refuses_with_its_program_name(capsys, argv, msg):
    from autotune.__main__ import main
    rc = main(["--dry-run"] + argv + ([] if "--arch" in argv else ["--arch", "sm_90a"]))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"{AUTOTUNE}: error: ") and msg in err, err


def test_autotune_cost_model_without_arch_names_the_program(capsys):
    from autotune.__main__ import main
    assert main(["--cost", "model"]) == 2
    assert capsys.readouterr().err.startswith(f"{AUTOTUNE}: error: --cost model needs --arch")


@pytest.mark.parametrize("argv,msg", [
    (["--ctx", "-5k"], "--ctx: not a token count: '-5k'"),
    (["--tree", "0"], "--tree must be in 1..256, got 0"),
])
def test_autotune_show_refuses(capsys, argv, msg):
    from autotune.__main__ import main
    assert main(["show"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{AUTOTUNE} show: error: ") and msg in err and err.count("\n") == 1, err


GPU_CHECK = "python -m bench.gpu_check"


def test_gpu_check_collect_of_a_missing_folder_is_one_line(capsys):
    _one_line_error(capsys, gpu_check.main, ["--collect", "/nonexistent"], GPU_CHECK,
                    "--collect /nonexistent: no gpu_check_results.tar.gz under /nonexistent")


def test_gpu_check_collect_of_a_file_that_is_no_archive_is_one_line(capsys, tmp_path):
    bad = tmp_path / "gpu_check_results.tar.gz"
    bad.write_text("not a tar archive")
    _one_line_error(capsys, gpu_check.main, ["--collect", str(bad)], GPU_CHECK, "not a gzip'd tar archive")


def test_gpu_check_dry_run_caps_stay_within_its_budget(capsys, monkeypatch, tmp_path):
    """Each stage runs under min(its cap, what the budget leaves): the plan prints those, adding up to the budget."""
    monkeypatch.setenv("OUT", str(tmp_path / "o"))
    for budget in ("460", "100"):
        assert gpu_check.main(["--dry-run", "--budget-s", budget]) == 0
        text = capsys.readouterr().out
        caps = [float(ln.split(" cap ")[1].split(" s")[0]) for ln in text.splitlines()
                if ln.startswith("  ") and " cap " in ln and ": " in ln]
        assert len(caps) >= 10 and sum(caps) <= float(budget), (budget, caps)
        assert f"caps add up to {sum(caps):.0f} s within the budget of {float(budget):.0f} s" in text
    assert "runs only if earlier stages finish early" in text
    assert not Path(tmp_path / "o").exists()


@pytest.mark.parametrize("module,argv,msg", [
    ("bench.overhead", ["--nodes", "300"], "--nodes must be in 1..256, got 300"),
    ("bench.overhead", ["--calls", "0"], "--calls must be in 1..10,000,000, got 0"),
    ("bench.knockout", ["--tree", "300"], "--tree 300: at most 256 nodes per request"),
    ("bench.knockout", ["--ctx", "-5k"], "--ctx: not a token count: '-5k'"),
    ("bench.knockout", ["--variants", "x"], "--variants: knockout bits"),
    ("bench.knockout", ["--reps", "0"], "--reps must be >= 1, got 0"),
    ("bench.fp8_accuracy", ["--ctx", "x"], "--ctx: not a token count: 'x'"),
    ("bench.fp8_accuracy", ["--tree", "0"], "--tree must be in 1..256"),
    ("bench.fp8_accuracy", ["--seeds", "0"], "--seeds must be >= 1, got 0"),
    ("bench.fp8_accuracy", ["--ctx", "900m"], "--ctx 900,000,000 would allocate ~"),
    ("bench.fp8_mma_error", ["--tokens", "-3"], "--tokens must be >= 1, got -3"),
    ("bench.fp8_mma_error", ["--logit-std", "x"], "--logit-std: comma-separated numbers, got 'x'"),
    ("bench.fp8_mma_error", ["--tokens", "900000000"], "--tokens 900,000,000 would allocate ~"),
    ("integration.decode", ["--ctx", "-5k"], "--ctx: not a token count: '-5k'"),
])
def test_bench_and_integration_tools_refuse(capsys, module, argv, msg):
    import importlib
    prog = f"python -m {module}" if module.startswith("bench.") else None
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and msg in lines[0] and "Traceback" not in err, err
    if prog:
        assert lines[0].startswith(f"{prog}: error: "), lines[0]


def test_emu_sweep_refusal_names_the_program(capsys):
    from bench.studies import emu_sweep
    assert emu_sweep.main(["--cases", "0"]) == 2
    assert capsys.readouterr().err == "python -m bench.emu_sweep: error: --cases must be >= 1, got 0\n"


def test_integration_tool_errors_name_the_program():
    """The integration tools raise a bare 'error: ...': run with -m, the line starts with the program's name."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "integration.decode", "--tp", "0"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert r.returncode == 2 and r.stderr == "python -m integration.decode: error: --tp must be >= 1\n", r.stderr


MODEL = "python -m bench.model"


@pytest.mark.parametrize("argv,msg", [
    (["--ctx", "-5k"], "--ctx: not a token count: '-5k'"),     # argparse would say "expected one argument"
    (["--ctx=-5k"], "--ctx: not a token count: '-5k'"),
    (["--tree", "300"], "--tree 300: at most 256 nodes per request"),
    (["--tree", "16,1000"], "--tree 1000: at most 256 nodes per request"),
])
def test_bench_model_refuses_as_bench_verify_does(capsys, argv, msg):
    """The same one-line messages as bench.verify's (shared helpers: verify_attn.utils.flag_value, dash_values;
    verify_attn.tree.check_tree_sizes), before any cubin is built."""
    from bench.model.__main__ import main
    _one_line_error(capsys, main, argv + ["--arch", "sm_120a", "--no-bands"], MODEL, msg)


def test_gpu_check_only_of_an_unknown_stage_names_the_program(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path / "o"))
    _one_line_error(capsys, gpu_check.main, ["--dry-run", "--only", "BOGUS"], GPU_CHECK,
                    "--only: unknown stage(s) BOGUS; known: build, smoke, tests,")


def test_autotune_refuses_a_run_that_cannot_fit_the_gpu(capsys, monkeypatch):
    """A measured tuning run makes bench.verify's inputs: the same estimate (bench.core.memory), refused with the
    figure before anything is allocated (here: a GPU with 100 MB free)."""
    import torch

    from autotune.__main__ import main
    from bench.core import memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1e8 if device == "cuda" else None)
    assert main(["--arch", "sm_90a", "--ctx", "185k", "--tree", "16,64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{AUTOTUNE}: error: --ctx 185,000 --tree 64 --batch 1 (page 1) "
                                                   "would allocate ~"), err
    assert "GB on the cuda (inputs and the float64 reference), more than the 0.1 GB available: lower --ctx" in err


@pytest.mark.parametrize("module,argv,msg", [
    ("integration.decode", ["--model", "kimi-k2-tp8", "--tp", "8", "--ctx", "185k"],
     "--model kimi-k2-tp8 --ctx 185,000 would allocate ~"),
    ("integration.bench_e2e", ["--model", "kimi-k2-tp8", "--simulate-rank", "--ctx", "185k"],
     "--model kimi-k2-tp8 --ctx 185,000 would allocate ~"),
])
def test_integration_tools_refuse_a_run_that_cannot_fit(capsys, monkeypatch, module, argv, msg):
    """Kimi K2's rank shard is tens of GB: refused, with the figure per rank and the ranks sharing the memory, before
    any rank starts (here: 2 GB free), in the tools' one-line form."""
    import importlib

    from bench.core import memory
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2e9)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and msg in lines[0] and "Traceback" not in err, err
    assert "GB per rank x " in lines[0] and "more than the 2.0 GB available: lower --ctx or --layers" in lines[0]
