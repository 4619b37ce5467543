import sys

from ..gpu_run.gpu_check import main

sys.exit(main())
