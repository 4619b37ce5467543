"""`python -m bench.ceilings`: kept at its old path; the code is bench/core/ceilings.py."""
import sys

from .core.ceilings import *  # noqa: F401,F403
from .core.ceilings import main

if __name__ == "__main__":
    sys.exit(main())
