"""Benchmarks: `python -m bench.verify` (tree-verify attention vs the roofline floor),
`python -m bench.ceilings` (measured device ceilings), `python -m bench.gpu_check`
(one prepared command for a short GPU window)."""
