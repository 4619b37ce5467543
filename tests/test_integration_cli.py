"""Bad command-line input to the integration tools ends in a one-line error naming the
flag, before any model is built or rank spawned."""
import pytest

from integration import bench_e2e, decode, probe


@pytest.mark.parametrize("main,argv,msg", [
    (decode.main, ["--model", "nope"], "--model: unknown model preset 'nope'"),
    (decode.main, ["--ctx", "-5"], "--ctx: not a token count"),
    (decode.main, ["--attn-backend", "nope"], "--attn-backend: unknown nope; known: auto"),
    (decode.main, ["--tp", "0"], "--tp must be >= 1"),
    (decode.main, ["--steps", "0"], "--steps must be >= 1"),
    (decode.main, ["--layout", "paged", "--page-size", "0"], "--page-size must be in 1..128"),
    (probe.main, ["--short", "4k", "--long", "256"], "--long \\(256\\) must be longer than --short \\(4000\\)"),
    (probe.main, ["--dtype", "f8"], "--dtype must be one of"),
    (probe.main, ["--attn-backend", "zz"], "--attn-backend: unknown zz"),
    (bench_e2e.main, ["--ctx", "x"], "--ctx: not a token count"),
    (bench_e2e.main, ["--attn-backend", "zz"], "--attn-backend: unknown zz"),
])
def test_bad_cli_input(main, argv, msg):
    with pytest.raises(SystemExit, match=msg):
        main(argv)
