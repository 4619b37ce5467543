"""`python -m bench.peer_bundle`: kept at its old path; the code is bench/benchmark/peer_bundle.py."""
import sys

from .benchmark.peer_bundle import *  # noqa: F401,F403
from .benchmark.peer_bundle import main

if __name__ == "__main__":
    sys.exit(main())
