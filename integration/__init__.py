"""A minimal TP8 DFlash + DDTree speculative decode loop that calls verify_attn.tree_verify.

Modules: config (model presets), tp (torch.distributed helpers), rope (YaRN), model (the MLA
target), drafter / drafter_weights (DFlash and its synthetic copy-circuit weights), texts
(prompts), ddtree (draft trees), kv (slot/page bookkeeping, allocator policies), accept
(greedy and sampling acceptance), metrics (independent counters), spec (the speculative loop),
timing (per-part timers, NVTX), costmodel / acceptance / budget (the draft-budget planner),
traffic (bytes per part), decode / bench_e2e / probe (command-line tools).
See integration/README.md for how acceptance arises with synthetic weights.
"""
