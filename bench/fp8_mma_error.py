"""`python -m bench.fp8_mma_error`: kept at its old path; the code is bench/studies/fp8_mma_error.py."""
import sys

from .studies.fp8_mma_error import *  # noqa: F401,F403
from .studies.fp8_mma_error import main

if __name__ == "__main__":
    sys.exit(main())
