"""`python -m bench.ncu_probe`: kept at its old path; the code is bench/gpu_run/ncu_probe.py."""
import sys

from .gpu_run.ncu_probe import *  # noqa: F401,F403
from .gpu_run.ncu_probe import main

if __name__ == "__main__":
    sys.exit(main())
