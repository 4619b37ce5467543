"""`python -m bench.verify`: kept at its old path; the code is bench/benchmark/verify.py."""
import sys

from .benchmark.verify import *  # noqa: F401,F403
from .benchmark.verify import main

if __name__ == "__main__":
    sys.exit(main())
