// A plain C interface to the emulator's host controls, for test harnesses
// that load an emulation build through ctypes (tests/test_arch_emu.py).
#include <cstdio>
#include <exception>
#include <string>

#include "host.h"
#include "c_api.h"

#define VA_EMU_C_API extern "C" __attribute__((visibility("default")))

using va::emu::guarded;

VA_EMU_C_API void va_emu_register_global(const void* p, size_t bytes, const char* name) {
  va::emu::register_global(p, bytes, name);
}
VA_EMU_C_API void va_emu_clear_globals() { va::emu::clear_globals(); }
VA_EMU_C_API const char* va_emu_set_fault(const char* what, int nth) {
  return guarded([&] { va::emu::set_fault(what, nth); });
}
VA_EMU_C_API const char* va_emu_set_fault_threads(int lo, int hi) {
  return guarded([&] { va::emu::set_fault_threads(lo, hi); });
}
VA_EMU_C_API long long va_emu_fault_hits() { return va::emu::fault_hits(); }
VA_EMU_C_API const char* va_emu_set_schedule(const char* name, unsigned long long seed) {
  return guarded([&] { va::emu::set_schedule(name, seed); });
}
VA_EMU_C_API const char* va_emu_set_cp_async_landing(const char* when) {
  return guarded([&] { va::emu::set_cp_async_landing(when); });
}
VA_EMU_C_API const char* va_emu_set_num_workers(int n) {
  return guarded([&] { va::emu::set_num_workers(n); });
}
VA_EMU_C_API void va_emu_set_smem_limit(size_t bytes) { va::emu::set_smem_limit(bytes); }
// counters: launches, blocks, threads, block_syncs, warp_collectives, mma, cp_async_bytes
VA_EMU_C_API void va_emu_stats(long long* out7) {
  const va::emu::Stats s = va::emu::stats();
  const long long v[7] = {s.launches, s.blocks, s.threads, s.block_syncs, s.warp_collectives, s.mma,
                          s.cp_async_bytes};
  for (int i = 0; i < 7; ++i) out7[i] = v[i];
}
// prefetch counters: l2_prefetches, cp_async_src_bytes, cp_async_src_prefetched, cp_async16_src_prefetched
VA_EMU_C_API void va_emu_prefetch_stats(long long* out4) {
  const va::emu::Stats s = va::emu::stats();
  out4[0] = s.l2_prefetches, out4[1] = s.cp_async_src_bytes, out4[2] = s.cp_async_src_prefetched;
  out4[3] = s.cp_async16_src_prefetched;
}
// the most dynamic shared memory one launch asked for since the last reset (what the host code computed: a check
// of verify_attn/build.py's mirror of the kernels' shared-memory plans)
VA_EMU_C_API long long va_emu_max_dyn_smem() { return va::emu::stats().max_dyn_smem; }
VA_EMU_C_API void va_emu_reset_stats() { va::emu::reset_stats(); }
