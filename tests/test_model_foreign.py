"""bench/model/foreign.py: reading a kernel without the project's `// sass-model` markers.

The loop finder must find, in our own cubins with the markers ignored, the tile loop the markers name (every
split kernel of the MLA instantiations on both archs); the command line reads a function by regex and says
what it found; --validate's P-12 (FlashAttention-2's forward kernel) is 'not reached' with the build command
when FA2's cubin is not here (it takes 7 minutes to build: NOTES.md has the reading).
"""
from __future__ import annotations

import re

import pytest

from bench.model import foreign, kernels, sass
from verify_attn import build as vb


def _cubin(head: str, arch: str):
    try:
        return vb.compile_cubin(vb.instantiation_file("bf16", head, "page1"), arch)
    except RuntimeError as e:   # no nvcc here
        pytest.skip(f"cannot build the cubin: {e}")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("head", ["mla576", "mla576e4m3"])
def test_hot_loop_finds_the_marked_tile_loop_without_markers(arch, head):
    cubin = _cubin(head, arch)
    try:
        funcs = sass.parse(sass.disassemble(cubin))
    except RuntimeError as e:
        pytest.skip(str(e))
    seen = 0
    for name, f in funcs.items():
        if "tree_verify_split_kernel" not in name or not vb._compiled_tile(name).targets(arch):
            continue
        _, _, marked = kernels._marked_loop(f, "tile_loops")
        assert foreign.hot_loop(f) == marked, vb._describe(name)[0]
        seen += 1
    assert seen >= 1


def test_foreign_command_line_reads_one_function(capsys):
    from bench.model.__main__ import main
    cubin = _cubin("mla576", "sm_90a")
    try:
        names = [n for n in sass.parse(sass.disassemble(cubin)) if "tree_verify_split_kernel" in n]
    except RuntimeError as e:
        pytest.skip(str(e))
    v1 = next(n for n in names if vb._describe(n)[0].endswith("v1 m32 n32 w8 s4 k4 sn2 b1"))
    assert main(["--foreign", str(cubin), "--function", re.escape(v1) + "$", "--threads", "256", "--grid", "264",
                 "--trips", "100", "--smem", "0", "--flops", "1e12", "--no-bands"]) == 0
    out = capsys.readouterr().out
    assert "hot loop" in out and "MMA per warp per iteration" in out and "TFLOP/s" in out
    with pytest.raises(SystemExit):                       # several functions match
        main(["--foreign", str(cubin), "--function", "tree_verify", "--threads", "256", "--grid", "1", "--trips", "1"])
    assert "narrow it" in capsys.readouterr().err
    with pytest.raises(SystemExit):                       # a launch argument missing
        main(["--foreign", str(cubin), "--function", re.escape(v1)])
    assert "--foreign needs --threads" in capsys.readouterr().err


def test_p12_not_reached_without_the_fa2_cubin(monkeypatch, tmp_path):
    from bench.model import validate
    monkeypatch.setenv("VA_FA2_CUBIN", str(tmp_path / "absent.cubin"))
    (item,) = validate._foreign_items()
    assert item.id == "P-12" and item.status == "not reached" and "build_fa2.sh" in item.note
    assert foreign.FA2_P12["grid"] == 2048 and foreign.FA2_P12["trips"] == 128   # P-12: b2 h16 s8192, 128 x 64 tiles
