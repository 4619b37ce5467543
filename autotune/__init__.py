"""Per-context-length autotuning of tree-verify kernel configs (`python -m autotune`).

space.py: candidates and pruning per arch; plan.py: the per-bucket plan (dry run);
search.py: the tuning loop (injectable timer/checker); harness.py: GPU inputs,
reference check and cold-L2 timer; cache.py: resumable cache with atomic merged
writes; export.py: the tuned-config files `verify_attn.tuned` reads; run.py: the
GPU run that ties them together.
"""
from .cache import TuneCache
from .plan import make_plan
from .search import BucketResult, tune_bucket
from .space import ARCHS, get_arch

__all__ = ["TuneCache", "make_plan", "BucketResult", "tune_bucket", "ARCHS", "get_arch"]
