"""A minimal TP8 DFlash + DDTree speculative decode loop that calls verify_attn.tree_verify.

Modules: config (model presets), tp (torch.distributed helpers, parallel linears),
rope (YaRN), model (the MLA target), drafter (DFlash), ddtree (draft trees),
kv (slot/page bookkeeping), timing (per-part step timers, NVTX), spec (the
speculative loop), decode / bench_e2e / probe (command-line tools).
See integration/README.md for how acceptance arises with synthetic weights.
"""
