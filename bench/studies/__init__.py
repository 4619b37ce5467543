"""Accuracy and overhead studies, each a command that prints one table: what an FP8 cache costs against bf16
(fp8_accuracy), the error of FP8 MMAs against the reference (fp8_mma_error), random cases through named tiles on
the emulator (emu_sweep), the host overhead of a call (overhead). Imports bench.core only."""
