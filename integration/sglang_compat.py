"""integration.sglang_compat: kept at its old path (README: the SGLang drop-in); the code is integration/serving/sglang_compat.py."""
from .serving.sglang_compat import *  # noqa: F401,F403
from .serving.sglang_compat import extend_attention_fwd, verify_only  # noqa: F401
