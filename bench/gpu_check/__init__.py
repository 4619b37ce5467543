"""`python -m bench.gpu_check`: kept at its old path; the code is bench/gpu_run/gpu_check.py. A folder rather than
a bench/gpu_check.py beside the others: with no file left at the old path, git follows the rename, and an edit made
to bench/gpu_check.py on another branch merges into bench/gpu_run/gpu_check.py."""
from ..gpu_run.gpu_check import *  # noqa: F401,F403
