"""Serving-engine adapters: an SGLang attention backend whose target verify is one launch per layer
(sglang_backend, on verify_step's per-step plan), and SGLang's extend_attention_fwd signature on
verify_attn backends (sglang_compat, two calls and a merge per layer).
"""
