"""Benchmarks of tree-verify attention, in five rooms; each imports only the rooms before it
(tests/test_dependencies.py):

  core/       what every other room (and autotune/, integration/) measures with: the problem (inputs), counted bytes,
              FLOPs and floors (roofline), the GPU's measured ceilings (ceilings), cold-L2 timers (timing), one call
              checked and timed (measure), what a run allocates and the early refusal (memory)
  model/      the SASS performance model (`python -m bench.model`)
  benchmark/  `python -m bench.verify` and what it prints: report, plot, the committed measurements (measured), the
              kernels outside this project (baselines, peers, peer_bundle)
  gpu_run/    the GPU session: gpu_session.sh, gpu_check (its stages), gpu_results (--collect), knockout, ncu_probe
  studies/    accuracy and overhead studies: fp8_accuracy, fp8_mma_error, emu_sweep, overhead

results/ holds the committed measurements. The command lines keep their paths (`python -m bench.verify`,
`.gpu_check`, `.ceilings`, `.knockout`, `.ncu_probe`, `.peer_bundle`, `.fp8_accuracy`, `.fp8_mma_error`,
`.emu_sweep`, `.overhead`; `bash bench/gpu_session.sh`) through the small modules beside this file.
"""
