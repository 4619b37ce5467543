"""The GPU run: one prepared session on a lent GPU (gpu_session.sh -> gpu_check, its stages and their caps), its
short table and --collect (gpu_results), and the timing experiments it runs (knockout, ncu_probe). Imports
bench.core and bench.model; starts the benchmark and the ceilings as commands (`python -m bench.verify`)."""
