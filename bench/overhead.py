"""`python -m bench.overhead`: kept at its old path; the code is bench/studies/overhead.py."""
import sys

from .studies.overhead import *  # noqa: F401,F403
from .studies.overhead import main

if __name__ == "__main__":
    sys.exit(main())
