"""`python -m bench.emu_sweep`: kept at its old path; the code is bench/studies/emu_sweep.py."""
import sys

from .studies.emu_sweep import *  # noqa: F401,F403
from .studies.emu_sweep import main

if __name__ == "__main__":
    sys.exit(main())
