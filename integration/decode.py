"""`python -m integration.decode`: kept at its old path; the code is integration/measure/decode.py."""
import sys

from .measure.decode import *  # noqa: F401,F403
from .measure.decode import main

if __name__ == "__main__":
    sys.exit(main())
