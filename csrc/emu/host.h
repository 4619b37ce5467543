// Host-side controls of the CPU emulator (not used by kernels): tensor bounds
// for the strict global-memory checks, fault injection, scheduling and limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace va::emu {

// Global memory a kernel may touch: every ld_global/st_global/atomic_add and
// every cp.async source must fall inside one registered range.
void register_global(const void* p, size_t bytes, const char* name);
void clear_globals();

// Fault injection for testing the test suite: what = "skip_block_sync",
// "skip_cp_async_wait", "skip_wgmma_wait", "skip_fence_proxy_async" or "skip_mbarrier_wait"; nth = the
// per-thread call index (0-based, within each block) that is skipped, -1 = every call. Throws std::invalid_argument on an
// unknown name. fault_hits() counts calls actually skipped since set_fault.
// "named_barrier_miscount": the nth named barrier call (sync or arrive) counts 32 threads fewer than it says;
// "skip_named_barrier": the nth named barrier call (sync or arrive) is not made (the thread neither arrives nor waits).
// set_fault applies to every thread; set_fault_threads(lo, hi) after it narrows it to threadIdx.x in [lo, hi)
// (one role of a warp-specialized kernel: a math warp skipping its "full" wait, the producer its "empty" one).
void set_fault(const char* what, int nth);
void set_fault_threads(int lo, int hi);
void clear_faults();
long long fault_hits();

// Order in which the scheduler resumes the runnable threads of a block:
// "forward" (thread 0 first), "reverse", "random" (seeded): each pass resumes
// every runnable thread once, so warps move in near lockstep;
// "warp-ahead" / "warp-ahead-reverse": the first (last) warp runs until all its
// threads wait at a block barrier before the next warp moves. Any schedule is a
// legal execution; different ones expose different missing-barrier races
// (warp-ahead finds the most).
void set_schedule(const char* name, uint64_t seed = 0);
// When cp.async bytes land in shared memory: "wait" (default; the latest legal
// moment, at the wait_group covering their group: a missing wait reads stale
// data) or "issue" (the earliest: a stage overwritten while other threads still
// read it, i.e. a missing barrier before reuse, corrupts their reads; combine
// with a warp-ahead schedule). Env VA_EMU_CP_ASYNC.
void set_cp_async_landing(const char* when);
// OS threads that run blocks concurrently (0 = hardware concurrency).
void set_num_workers(int n);
// Largest dynamic shared memory a launch may request (default 227 KB, the
// sm_90 opt-in maximum).
void set_smem_limit(size_t bytes);

struct Stats {
  long long launches = 0;
  long long blocks = 0;
  long long threads = 0;
  long long block_syncs = 0;         // completed block barriers
  long long warp_collectives = 0;    // completed warp collectives (incl. mma, ldmatrix)
  long long mma = 0;                 // completed mma.sync (warp-wide)
  long long cp_async_bytes = 0;      // bytes landed by cp.async
  long long l2_prefetches = 0;       // prefetch.global.L2 requests (one per thread and call)
  long long cp_async_src_bytes = 0;  // bytes read by cp.async from global memory (valid copies)
  long long cp_async_src_prefetched = 0;  // ... of which in a 128-byte line the same block prefetched before
  long long cp_async16_src_prefetched = 0;  // ... of those, by 16-byte copies
  long long max_dyn_smem = 0;        // the most dynamic shared memory one launch asked for (bytes)
};
Stats stats();
void reset_stats();

// One line per setting, for logs.
std::string describe_settings();

}  // namespace va::emu
