"""Serving-engine adapters: SGLang's extend_attention_fwd signature on verify_attn backends
(sglang_compat).
"""
