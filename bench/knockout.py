"""`python -m bench.knockout`: kept at its old path; the code is bench/gpu_run/knockout.py."""
import sys

from .gpu_run.knockout import *  # noqa: F401,F403
from .gpu_run.knockout import main

if __name__ == "__main__":
    sys.exit(main())
