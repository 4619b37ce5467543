"""`python -m integration.budget`: kept at its old path; the code is integration/planning/budget.py."""
import sys

from .planning.budget import *  # noqa: F401,F403
from .planning.budget import main

if __name__ == "__main__":
    sys.exit(main())
