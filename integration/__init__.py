"""A minimal TP8 DFlash + DDTree speculative decode loop that calls verify_attn.tree_verify, and what plans,
measures and serves it. Four rooms, each importing only the ones before it:

  loop/      the speculative loop itself: the MLA target (model, tp, rope, config), the DFlash drafter
             (drafter, drafter_weights), draft trees (ddtree), KV bookkeeping (kv), acceptance (accept),
             the loop (spec) with its independent counters (metrics) and timers (timing), prompts (texts)
  planning/  the draft-budget planner: step cost (costmodel), expected acceptance (acceptance), the choice
             and --budget auto (budget); profiles in integration/profiles/
  measure/   what runs the loop and measures it: decode (--check), probe, bench_e2e, traffic
  serving/   serving-engine adapters: sglang_compat (imports only verify_attn)

The command lines keep their paths (`python -m integration.decode`, `.probe`, `.budget`, `.bench_e2e`,
`.traffic`) and `integration.sglang_compat` its import path, through the small modules beside this file.
See integration/README.md for how acceptance arises with synthetic weights.
"""
