"""bench.model.regs: live vector registers per SASS instruction, on synthetic listings with known answers."""
from __future__ import annotations

import pytest

from bench.model import regs, sass
from test_model import _sass


def _fn(body: str, src: str = "/k.cuh") -> sass.Function:
    return sass.parse(_sass(body, src))["_Z6kernelv"]


def _counts(f: sass.Function) -> list[int]:
    return [len(x) for x in regs.liveness(f).live_out]


def test_straight_line_values_live_from_write_to_last_read():
    f = _fn("""
        1|MOV R1, 0x1
        2|MOV R2, 0x2
        3|IADD3 R3, R1, R2, RZ
        4|STS [R0], R3
        5|EXIT
    """)
    # R0 (the address, from the entry) is live until the store; R1 and R2 until the add; R3 until the store
    assert _counts(f) == [2, 3, 2, 0, 0]
    lv = regs.liveness(f)
    assert lv.peak == 3 and f.instrs[lv.peak_index()].line == 2
    assert lv.live_out[1] == frozenset({"R0", "R1", "R2"})


def test_a_value_read_in_a_loop_is_live_across_the_whole_loop():
    # R7 is set before the loop and read at its top: after its last read in an iteration it is still live (the back
    # edge reads it again), so every instruction of the loop counts it; R9, the counter, likewise
    f = _fn("""
        1|MOV R7, 0x10
        1|MOV R9, RZ
        .L_x_1:
        2|LDS R4, [R7]
        3|FADD R5, R4, R4
        3|STS [R7+0x4], R5
        2|IADD3 R9, R9, 0x1, RZ
        2|ISETP.NE.AND P0, PT, R9, 0x20, PT
        2|@P0 BRA `(.L_x_1)
        4|EXIT
    """)
    counts = _counts(f)
    assert counts == [1, 2, 3, 3, 2, 2, 2, 2, 0]
    assert all("R7" in x for x in regs.liveness(f).live_out[1:8])


def test_a_predicated_write_keeps_the_old_value_alive():
    f = _fn("""
        1|MOV R2, 0x1
        2|@P0 MOV R2, 0x2
        3|STS [R0], R2
        4|EXIT
    """)
    # R2's first value survives where P0 is false: live from the first MOV to the store
    assert "R2" in regs.liveness(f).live_out[0] and _counts(f) == [2, 2, 0, 0]
    g = _fn("""
        1|MOV R2, 0x1
        2|MOV R2, 0x2
        3|STS [R0], R2
        4|EXIT
    """)
    assert "R2" not in regs.liveness(g).live_out[0]


def test_wide_operands_and_a_branch_around_a_block():
    f = _fn("""
        1|LDS.64 R4, [R0]
        2|@P1 BRA `(.L_x_2)
        3|FADD R6, R4, R5
        3|STS [R0], R6
        .L_x_2:
        4|STS.64 [R0+0x8], R4
        5|EXIT
    """)
    counts = _counts(f)
    assert counts[0] == 3 and counts[1] == 3  # R0 and the pair R4, R5 (LDS.64 writes two registers)
    assert counts[2] == 4 and counts[3] == 3 and counts[4] == 0


def test_report_names_the_peak_line_and_the_calls(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text("int a;\nint b = a + 1;\nfoo();\nbar();\n")
    f = _fn("""
        1|MOV R1, 0x1
        2|MOV R2, 0x2
        2|MOV R3, 0x3
        3|CALL.REL.NOINC `(.L_x_9)
        3|IADD3 R4, R1, R2, R3
        4|STS [R0], R4
        4|EXIT
        .L_x_9:
        4|RET.REL.NODEC R20 `(_Z6kernelv)
    """, str(src))
    out = regs.report(regs.liveness(f), top=2, around=0x40, window=1)
    text = "\n".join(out)
    assert "peak: 4 vector registers live" in text and "(line 2)" in out[1]
    assert "1 CALL(s)" in text and "line 3" in text
    assert "   4  k.cuh:2  int b = a + 1;" in text  # the line with the most registers live, and its source
    assert "/*0040*/" in text  # the instructions around the address asked for


def test_cli_refuses_an_unknown_stem_and_a_bad_argument(capsys):
    assert regs.main(["no_such_stem"]) == 2
    assert "neither a .cubin nor an instantiation stem" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        regs.main(["mla576_bf16_page1", "--around", "zz"])
    assert "--around" in capsys.readouterr().err
