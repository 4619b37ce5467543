"""`python -m integration.probe`: kept at its old path; the code is integration/measure/probe.py."""
import sys

from .measure.probe import *  # noqa: F401,F403
from .measure.probe import main

if __name__ == "__main__":
    sys.exit(main())
