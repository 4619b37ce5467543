"""`python -m integration.traffic`: kept at its old path; the code is integration/measure/traffic.py."""
import sys

from .measure.traffic import *  # noqa: F401,F403
from .measure.traffic import main

if __name__ == "__main__":
    sys.exit(main())
