"""The speculative decode loop: the MLA target and its TP helpers (model, tp, rope, config), the DFlash
drafter (drafter, drafter_weights), draft trees (ddtree), the KV bookkeeping (kv), acceptance (accept),
the loop itself (spec) with its independent counters (metrics) and per-part timers (timing), prompts
(texts). Imports nothing else of integration/.
"""
