"""`python -m bench.fp8_accuracy`: kept at its old path; the code is bench/studies/fp8_accuracy.py."""
import sys

from .studies.fp8_accuracy import *  # noqa: F401,F403
from .studies.fp8_accuracy import main

if __name__ == "__main__":
    sys.exit(main())
