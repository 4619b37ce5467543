"""`python -m integration.bench_e2e`: kept at its old path; the code is integration/measure/bench_e2e.py."""
import sys

from .measure.bench_e2e import *  # noqa: F401,F403
from .measure.bench_e2e import main

if __name__ == "__main__":
    sys.exit(main())
