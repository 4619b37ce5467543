"""Bad command-line input to the integration tools ends in a one-line error naming the
flag, before any model is built or rank spawned."""
import pytest

from integration import bench_e2e, budget, decode, probe, traffic


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
    (decode.main, ["--budget", "lots"], "--budget: expected auto or a node count"),
    (decode.main, ["--budget", "0"], "--budget must be auto or >= 1"),
    (decode.main, ["--budget", "auto", "--tree", "chain"], "--budget auto needs --tree ddtree"),
    (decode.main, ["--budget", "auto", "--budget-device", "a100"], "--budget-device: unknown"),
    (decode.main, ["--budget", "auto", "--profile", "/nonexistent.json"], "--profile:"),
    (decode.main, ["--temperature", "-1"], "--temperature must be >= 0"),
    (probe.main, ["--plant", "window:x", "--drafter", "real"], "--plant: window bug needs a row count"),
    (probe.main, ["--plant", "gremlins", "--drafter", "real"], "--plant: unknown drafter bug"),
    (probe.main, ["--plant", "untrimmed"], "--plant needs --drafter real"),
    (probe.main, ["--logit-tol", "0"], "--logit-tol must be > 0"),
    (traffic.main, ["--ctx", "1k,3k"], "--ctx: every context must exceed the drafter window"),
    (traffic.main, ["--ctx", "3k"], "--ctx needs at least two contexts"),
    (budget.main, ["--device", "rtx-pro-6000"], "--profile is required"),
])
def test_bad_cli_input(main, argv, msg):
    with pytest.raises(SystemExit, match=msg):
        main(argv)
