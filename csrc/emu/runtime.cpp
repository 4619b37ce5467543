// The CPU SIMT emulator: grid launcher, block scheduler (threads as fibers),
// block barriers, warp collectives and the strict memory checks.
//
// Strictness beyond the hardware (each finds a class of kernel bugs):
//  - dynamic shared memory is filled with 0xFF (NaN for bf16/fp16/fp32) at
//    block start, with a 0xFF red zone after it that must still be intact when
//    the block ends;
//  - cp.async reads its source at issue time but the bytes land only when a
//    wait_group that covers their commit group runs (a missing wait reads NaN);
//  - every global access, cp.async source and ldmatrix row is checked against
//    the registered tensors / the block's shared memory, size and alignment;
//  - a barrier or warp collective that some threads never reach (they exited,
//    or they wait elsewhere) is reported as a deadlock with the source lines,
//    and lanes of one warp in different collectives, or threads of a block at
//    different block_sync calls, are reported as divergence;
//  - thread-block clusters: a cluster's CTAs run in one scheduler loop; a
//    remote mbarrier used before a cluster_sync made its init visible, an
//    access to a CTA that exited, a cluster_sync some thread never reaches and
//    a bulk copy whose source the async proxy may not see are reported.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#if !defined(VA_EMULATION)
#define VA_EMULATION 1
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>

#include "../host/fp8.h"
#include "device.h"
#include "fiber.h"
#include "host.h"
#include "launch.h"

namespace va::emu {

thread_local ThreadCtx* tls_cur = nullptr;

namespace {

constexpr size_t kRedZoneBytes = 256;
constexpr size_t kStackPoisonBytes = 16 * 1024;
constexpr int kMaxStoredErrors = 12;
constexpr int kMaxThreadsPerBlock = 1024;

// ---------------------------------------------------------------------------
// settings (written between launches, read during them)

struct Range {
  uintptr_t lo;
  uintptr_t hi;
  std::string name;
};

enum class FaultKind {
  kNone, kSkipBlockSync, kSkipCpAsyncWait, kSkipWgmmaWait, kSkipFenceProxyAsync, kSkipMbarrierWait,
  kNamedBarrierMiscount, kSkipNamedBarrier
};
enum class Schedule {
  kForward, kReverse, kRandom, kWarpAhead, kWarpAheadReverse, kLagging, kLaggingMid, kLaggingTail, kStarveLast,
  kLaggingHead, kStalledMid, kStalledHead, kStalledPeer, kStalledPeerMid
};
// the schedules' names, in the enum's order (set_schedule, VA_EMU_SCHEDULE, describe_settings)
constexpr const char* kScheduleNames[] = {"forward", "reverse", "random", "warp-ahead", "warp-ahead-reverse", "lagging",
                                          "lagging-mid", "lagging-tail", "starve-last", "lagging-head",
                                          "stalled-mid", "stalled-head", "stalled-peer", "stalled-peer-mid"};
bool schedule_named(const std::string& name, Schedule& out) {
  for (size_t i = 0; i < std::size(kScheduleNames); ++i)
    if (name == kScheduleNames[i]) {
      out = static_cast<Schedule>(i);
      return true;
    }
  return false;
}
// the warps the lagging and starve-last schedules hold back: a third of the block's, at least one
int held_warps(int nwarps) { return std::max(1, nwarps / 3); }

struct Settings {
  std::vector<Range> globals;
  FaultKind fault = FaultKind::kNone;
  int fault_nth = -1;
  // the threads (threadIdx.x in [lo, hi)) a fault applies to: one warp role of a warp-specialized kernel
  int fault_tid_lo = 0, fault_tid_hi = kMaxThreadsPerBlock;
  Schedule schedule = Schedule::kForward;
  uint64_t seed = 0;
  int workers = 0;
  bool cp_async_at_issue = false;  // land cp.async copies when issued instead of at the wait
  size_t smem_limit = 227 * 1024;
  size_t stack_bytes = 256 * 1024;
};

Settings& settings() {
  static Settings s = [] {
    Settings d;
    if (const char* w = std::getenv("VA_EMU_WORKERS")) d.workers = std::atoi(w);
    if (const char* k = std::getenv("VA_EMU_STACK_KB")) d.stack_bytes = size_t(std::atoi(k)) * 1024;
    if (const char* cp = std::getenv("VA_EMU_CP_ASYNC")) d.cp_async_at_issue = std::string(cp) == "issue";
    if (const char* sch = std::getenv("VA_EMU_SCHEDULE")) {
      Schedule named;
      if (schedule_named(sch, named)) d.schedule = named;
    }
    return d;
  }();
  return s;
}

std::atomic<long long> g_fault_hits{0};
std::mutex g_stats_mu;
Stats g_stats;
std::mutex g_launch_mu;  // one emulated launch at a time

// ---------------------------------------------------------------------------
// per-launch state

struct LaunchState {
  const std::function<void()>* body = nullptr;
  dim3 grid, block;
  dim3 cluster{1, 1, 1};  // thread-block cluster shape (1x1x1: a launch without clusters)
  size_t smem_bytes = 0;
  // launched with programmatic dependent launch (va::arch::launch_dependent): until a thread's grid_dependency_wait
  // the previous grid may still be running, so the thread may not write global memory, nor read what that grid wrote
  bool dependent = false;
  std::mutex written_mu;
  std::vector<std::pair<uintptr_t, uintptr_t>> written;  // [lo, hi) of this grid's global stores and atomics
  std::mutex mu;
  std::vector<std::string> errors;  // first kMaxStoredErrors messages
  std::atomic<long long> error_count{0};
  std::atomic<bool> stop{false};
};
LaunchState* g_launch = nullptr;
// the global bytes the last finished launch stored to, merged [lo, hi) ranges (under g_launch_mu)
std::vector<std::pair<uintptr_t, uintptr_t>> g_prev_written;

// ---------------------------------------------------------------------------
// threads, warps, blocks

struct Block;
struct Warp;
struct Cluster;

enum class WaitKind { kNone, kBarrier, kWarp, kMbarrier, kNamed, kCluster };

struct PendingCopy {
  unsigned char* dst;
  unsigned char data[16];
  int bytes = 16;  // 4, 8 or 16 (cp.async cp-size)
};

struct Fiber {
  Context ctx;
  ThreadCtx tc{};
  Block* block = nullptr;
  bool done = false;
  WaitKind wait = WaitKind::kNone;
  std::source_location wait_loc;
  std::vector<PendingCopy> open_group;                 // issued, not yet committed
  std::deque<std::vector<PendingCopy>> committed;      // oldest first
  // landing "issue": this thread's copies that landed at issue since its last cp.async.wait_group, (smem offset,
  // bytes); a cp.async.mbarrier.arrive.noinc ties them to the barrier as it does the pending ones in landing "wait"
  std::vector<std::pair<size_t, int>> landed_untied;
  int block_sync_calls = 0;
  int cp_async_wait_calls = 0;
  int wgmma_wait_calls = 0;
  int fence_proxy_calls = 0;
  int mbarrier_wait_calls = 0;
  int named_barrier_calls = 0;
  long long proxy_fences = 0;  // fence_proxy_async calls so far
  // shared-memory words this thread wrote by st_shared since its last fence_proxy_async: a barrier or mbarrier
  // arrive that publishes them first marks them never visible to the async proxy (publish_generic)
  std::vector<size_t> unfenced_words;
  size_t wait_mbar = 0;        // kMbarrier: the barrier's shared-memory offset and the phase parity awaited
  unsigned wait_parity = 0;
  int wait_named = 0;          // kNamed: the named barrier's id
  int setmaxnreg_calls = 0;
  bool dependency_waited = false;  // grid_dependency_wait ran (a dependent launch's global accesses may follow)
};

// A bulk copy (cp.async.bulk): its source bytes, read at issue, and where they land.
struct BulkCopy {
  unsigned char* dst;
  std::vector<unsigned char> data;
};

// A named barrier (bar.sync / bar.arrive id, count): the arrivals of its current generation.
struct NamedBar {
  int count = 0;     // the thread count the generation's first arrival gave
  int arrived = 0;
  std::source_location loc;
};

// An mbarrier object (8 bytes of shared memory, keyed by its offset): a phase completes when its pending
// arrivals reach zero and its transaction count (bytes announced by expect_tx minus bytes the bulk
// copies delivered) is zero. The copies of a completed phase land when a thread first waits on it.
struct Mbar {
  size_t off = 0;                 // its shared-memory offset
  int count = 0;                  // arrivals per phase (mbarrier.init)
  int pending = 0;                // arrivals still due in the current phase
  long long tx = 0;               // transaction bytes still due in the current phase
  unsigned completed = 0;         // phases completed; the current phase's parity is completed & 1
  std::vector<BulkCopy> copies;   // issued in the current phase
  std::vector<BulkCopy> unlanded; // of completed phases, not yet waited for
  std::source_location init_loc;
  int init_tid = 0;               // the initialising thread: the others may use the barrier only after a
  long long init_syncs = 0;       // block barrier completed since (Block::syncs moved on)
  // Cluster::syncs when the initialising thread ran fence_mbarrier_init_cluster after the init (-1: it has not):
  // another CTA may use the barrier once a cluster_sync completed after that (Cluster::syncs moved on)
  long long cluster_fence = -1;
  // bulk copies from another CTA's shared memory (cp.async.bulk.shared::cluster) of the current phase: their source
  // bytes as read at issue, checked unchanged when the phase completes (the copy may read its source until then)
  struct SourceCheck {
    Block* from;
    size_t off;
    std::vector<unsigned char> bytes;
    std::source_location loc;
  };
  std::vector<SourceCheck> sources;
  // landing "wait": those copies' transactions, not yet counted. They complete at the latest legal moment: once the
  // phase's arrivals are in and a thread of this CTA waits on it (until then the source may still be read)
  std::vector<BulkCopy> deferred;
};

// Bytes of the copies from another CTA that a barrier's current phase holds back (counted when they complete).
long long deferred_bytes(const Mbar& m) {
  long long n = 0;
  for (const BulkCopy& c : m.deferred) n += static_cast<long long>(c.data.size());
  return n;
}

// One warp's part of an issued wgmma: its result (computed at issue), where it lands, and the shared
// memory it read (checked unchanged when it retires).
struct WgmmaOp {
  int n = 0;
  float* d[32] = {};
  std::vector<float> result;  // [32][n / 2]
  std::vector<const unsigned char*> read_at;
  std::vector<unsigned char> read_bytes;  // 16 per read_at
  std::source_location loc;
};

// The sequence of wgmmas one warpgroup issued, for checking that its 4 warps agree.
struct WgSig {
  int n, kind;
  bool ss, trans_b, accumulate;
  uint64_t desc_a, desc_b;
  bool operator==(const WgSig&) const = default;
};
struct WgLog {
  std::deque<WgSig> sigs;
  long long base = 0;  // index of sigs.front()
};

// A warp collective kind; identity is the object's address.
struct WarpOp {
  const char* name;
  void (*fn)(Warp& w);
};

struct Warp {
  Block* block = nullptr;
  int index = 0;
  int first_tid = 0;
  int nlanes = 0;
  int arrived = 0;
  const WarpOp* op = nullptr;
  std::source_location op_loc;
  void* args[32] = {};
  // wgmma (this warp's part of its warpgroup's ops)
  bool wg_fenced = false;                          // a wgmma_fence since the last wgmma_wait
  std::vector<WgmmaOp> wg_open;             // issued, not yet committed
  std::deque<std::vector<WgmmaOp>> wg_committed;
  long long wg_issued = 0;
};

struct Block {
  uint3 idx{};
  int nthreads = 0;
  int live = 0;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  Fiber* fibers = nullptr;
  std::vector<Warp> warps;
  int barrier_arrived = 0;
  std::source_location barrier_loc;
  bool abort = false;
  Context sched;
  // per 16-byte chunk of shared memory: 1 + the thread whose cp.async landed there last (0: none), and that
  // thread's fence_proxy_async count at the landing (a wgmma may read the chunk once the count moved on)
  std::vector<int32_t> chunk_writer;
  std::vector<long long> chunk_epoch;
  // per 4-byte word: 1 + the thread whose st_shared (a generic-proxy write) wrote it last (0: none, or overwritten
  // since by a cp.async or bulk copy), and that thread's fence_proxy_async count at the store. Kept apart from the
  // cp.async marks above: cp_async_mbarrier_arrive_noinc clears those, never these
  std::vector<int32_t> word_writer;
  std::vector<long long> word_epoch;   // the writer's fence count at the store
  std::vector<char> word_released;     // published by a release (a barrier, an mbarrier arrive) before its fence
  std::vector<WgLog> wg_logs;  // per warpgroup
  std::map<size_t, Mbar> mbars;  // by shared-memory offset
  NamedBar named[16];
  std::vector<std::vector<int>> maxnreg;  // per warpgroup, the values of its setmaxnreg calls in order
  // counters merged into the global Stats at the end of the launch
  long long syncs = 0, collectives = 0, mmas = 0, cp_bytes = 0;
  // prefetch.global.L2: the 128-byte lines this block prefetched, and how many of its cp.async source bytes
  // (valid copies) fall in a line it prefetched before the copy
  std::unordered_set<uintptr_t> prefetched_lines;
  long long l2_prefetches = 0, cp_src_bytes = 0, cp_src_prefetched = 0, cp16_src_prefetched = 0;
  // thread-block clusters: the cluster this CTA belongs to (a cluster of one in a launch without clusters), its
  // %cluster_ctarank, and whether its end-of-block checks ran (all its threads exited: live == 0)
  Cluster* cluster = nullptr;
  int rank = 0;
  bool exited = false;
};

// A thread-block cluster: its CTAs run together in one Worker, interleaved by one scheduler loop. Each keeps its
// own shared memory, fibers, barriers and checks; a CTA's Block lives until every CTA of the cluster is done.
struct Cluster {
  dim3 dims{1, 1, 1};
  int size = 1;
  std::vector<Block*> blocks;  // by rank: x + dims.x (y + dims.y z), (x, y, z) = blockIdx % dims
  int nthreads = 0;            // of all its CTAs: what a cluster_sync waits for
  int sync_arrived = 0;        // threads in the current cluster_sync
  long long syncs = 0;         // cluster_syncs completed
};

Fiber* cur_fiber() { return static_cast<Fiber*>(tls_cur->fiber); }

// ---------------------------------------------------------------------------
// error reporting

std::string where(std::source_location loc) {
  if (loc.line() == 0) return "";
  std::string f = loc.file_name();
  const size_t k = f.rfind("csrc/");
  if (k != std::string::npos) f = f.substr(k);
  return " at " + f + ":" + std::to_string(loc.line());
}

std::string who(const Block& b, const Fiber* f) {
  char buf[160];
  if (f == nullptr) {
    std::snprintf(buf, sizeof(buf), "block (%u,%u,%u)", b.idx.x, b.idx.y, b.idx.z);
  } else {
    std::snprintf(buf, sizeof(buf), "block (%u,%u,%u) thread (%u,%u,%u) [warp %d lane %d]", b.idx.x,
                  b.idx.y, b.idx.z, f->tc.thread_idx.x, f->tc.thread_idx.y, f->tc.thread_idx.z,
                  f->tc.warp, f->tc.lane);
  }
  return buf;
}

void report(const Block& b, const Fiber* f, const std::string& what, std::source_location loc) {
  LaunchState& st = *g_launch;
  const long long n = st.error_count.fetch_add(1);
  st.stop = true;  // start no further blocks
  if (n >= kMaxStoredErrors) return;
  std::lock_guard<std::mutex> lk(st.mu);
  st.errors.push_back(who(b, f) + ": " + what + where(loc));
}

void yield(Fiber* f) { switch_context(f->ctx, f->block->sched); }

// Abandons the whole block (after a report): the fiber never resumes; in a cluster, the whole cluster stops.
[[noreturn]] void abandon(Fiber* f) {
  f->block->abort = true;
  yield(f);
  std::abort();  // unreachable: an aborted block's fibers are never resumed
}

// Reports and abandons the whole block: the fiber never resumes.
[[noreturn]] void fatal(Fiber* f, const std::string& what, std::source_location loc) {
  report(*f->block, f, what, loc);
  f->block->abort = true;
  yield(f);
  std::abort();  // unreachable: an aborted block's fibers are never resumed
}

std::string hexaddr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

// ---------------------------------------------------------------------------
// memory checks

size_t natural_alignment(size_t bytes) {
  size_t a = bytes & (~bytes + 1);  // lowest set bit
  return a > 16 ? 16 : (a == 0 ? 1 : a);
}

// A dependent grid's thread before its grid_dependency_wait: no global write, no read of what the previous grid wrote
bool dependency_ok(Fiber* f, uintptr_t a, size_t bytes, bool write, const char* what, std::source_location loc) {
  if (g_launch == nullptr || !g_launch->dependent || f->dependency_waited) return true;
  bool hit = write;
  if (!hit) {
    auto it = std::upper_bound(g_prev_written.begin(), g_prev_written.end(), std::make_pair(a, UINTPTR_MAX));
    hit = (it != g_prev_written.begin() && std::prev(it)->second > a) ||
          (it != g_prev_written.end() && it->first < a + bytes);
  }
  if (hit)
    report(*f->block, f, std::string(what) + " of " + std::to_string(bytes) + " bytes at " +
                             hexaddr(reinterpret_cast<const void*>(a)) + " before grid_dependency_wait in a kernel "
                             "launched with programmatic dependent launch: " +
                             (write ? "the previous kernel may still read or write global memory"
                                    : "the previous kernel wrote these bytes and may still be running"),
           loc);
  return !hit;
}

bool check_global(Fiber* f, const void* p, size_t bytes, const char* what, std::source_location loc,
                  bool write = false) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (!dependency_ok(f, a, bytes, write, what, loc)) return false;
  if (write) {  // (a store right after the last one recorded extends it: epilogues store row by row)
    std::lock_guard<std::mutex> lk(g_launch->written_mu);
    auto& w = g_launch->written;
    if (!w.empty() && w.back().second == a) w.back().second = a + bytes;
    else w.emplace_back(a, a + bytes);
  }
  const size_t align = natural_alignment(bytes);
  if (a % align != 0) {
    report(*f->block, f, std::string(what) + " of " + std::to_string(bytes) + " bytes at " + hexaddr(p) +
                             " is not " + std::to_string(align) + "-byte aligned",
           loc);
    return false;
  }
  const Range* nearest = nullptr;
  uintptr_t best = UINTPTR_MAX;
  for (const Range& r : settings().globals) {
    if (a >= r.lo && a + bytes <= r.hi) return true;
    const uintptr_t d = a < r.lo ? r.lo - a : (a >= r.hi ? a - r.hi : 0);
    if (d < best) {
      best = d;
      nearest = &r;
    }
  }
  std::string msg = std::string(what) + " of " + std::to_string(bytes) + " bytes at " + hexaddr(p) +
                    " is outside every registered tensor";
  if (nearest != nullptr) {
    const long long off = static_cast<long long>(a) - static_cast<long long>(nearest->lo);
    msg += " (nearest: '" + nearest->name + "' of " + std::to_string(nearest->hi - nearest->lo) +
           " bytes, access at byte offset " + std::to_string(off) + ")";
  } else {
    msg += " (none registered)";
  }
  report(*f->block, f, msg, loc);
  return false;
}

bool check_smem(Fiber* f, const void* p, size_t bytes, const char* what, std::source_location loc) {
  const Block& b = *f->block;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto lo = reinterpret_cast<uintptr_t>(b.smem);
  const size_t align = bytes < 16 ? bytes : 16;  // ldmatrix rows and 16-byte copies: 16; smaller copies: their size
  if (a % align != 0) {
    report(b, f,
           std::string(what) + " shared address " + hexaddr(p) + " is not " + std::to_string(align) +
               "-byte aligned",
           loc);
    return false;
  }
  if (a < lo || a + bytes > lo + b.smem_bytes) {
    report(b, f,
           std::string(what) + " at shared offset " +
               std::to_string(static_cast<long long>(a) - static_cast<long long>(lo)) + " (+" +
               std::to_string(bytes) + " bytes) is outside the block's " + std::to_string(b.smem_bytes) +
               " bytes of dynamic shared memory",
           loc);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// warp collectives

void collective(const WarpOp* op, void* args, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  Warp& w = b.warps[f->tc.warp];
  if (w.nlanes != 32) {
    fatal(f, std::string(op->name) + ": full-warp collective in a partial warp of " +
                 std::to_string(w.nlanes) + " threads (blockDim must be a multiple of 32)",
          loc);
  }
  if (w.arrived == 0) {
    w.op = op;
    w.op_loc = loc;
  } else if (w.op != op) {
    fatal(f, std::string("warp divergence: this lane calls ") + op->name + " while other lanes of its warp wait in " +
                 w.op->name + where(w.op_loc),
          loc);
  }
  w.args[f->tc.lane] = args;
  if (++w.arrived == w.nlanes) {
    op->fn(w);
    w.arrived = 0;
    w.op = nullptr;
    for (int i = 0; i < w.nlanes; ++i) b.fibers[w.first_tid + i].wait = WaitKind::kNone;
    ++b.collectives;
    return;
  }
  f->wait = WaitKind::kWarp;
  f->wait_loc = loc;
  yield(f);
}

// mma.m16n8k16 fragment maps (PTX ISA, "Matrix Fragments for mma.m16n8k16
// with floating point type"): groupID = lane >> 2, tig = lane % 4.
struct MmaArgs {
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
  float* d;
};

template <bool kBf16>
float half_bits_to_float(uint16_t h) {
  if constexpr (kBf16) return __bfloat162float(__ushort_as_bfloat16(h));
  else return __half2float(__ushort_as_half(h));
}

// D = A B + C of one warp's m16n8kK MMA, A [16][K] and B [K][8] as floats, C gathered from the lanes:
// the products are exact in fp32 (16-bit or e4m3 operands); the sum is formed in double and rounded
// once (the hardware's accumulation order is not specified: this is the exact result rounded to fp32).
// Scatters D back to the lanes' d[] (row g + 8 (i >> 1), column 2t + (i & 1)).
template <int K>
void mma_finish(Warp& w, const float (&A)[16][K], const float (&B)[K][8]) {
  float D[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto* x = static_cast<const MmaArgs*>(w.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) D[g + 8 * (i >> 1)][2 * t + (i & 1)] = x->c[i];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double s = D[m][n];
      for (int k = 0; k < K; ++k) s += static_cast<double>(A[m][k]) * static_cast<double>(B[k][n]);
      D[m][n] = static_cast<float>(s);
    }
  for (int l = 0; l < 32; ++l) {
    auto* x = static_cast<MmaArgs*>(w.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) x->d[i] = D[g + 8 * (i >> 1)][2 * t + (i & 1)];
  }
  ++w.block->mmas;
}

template <bool kBf16>
void mma_fn(Warp& w) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto* x = static_cast<const MmaArgs*>(w.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h)
        A[g + 8 * (r & 1)][2 * t + h + 8 * (r >> 1)] =
            half_bits_to_float<kBf16>(static_cast<uint16_t>(x->a[r] >> (16 * h)));
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h)
        B[2 * t + h + 8 * r][g] = half_bits_to_float<kBf16>(static_cast<uint16_t>(x->b[r] >> (16 * h)));
  }
  mma_finish(w, A, B);
}
const WarpOp kMmaBf16{"mma.m16n8k16.bf16", mma_fn<true>};
const WarpOp kMmaF16{"mma.m16n8k16.f16", mma_fn<false>};

// mma.m16n8k32 .e4m3 (PTX ISA, "Matrix Fragments for mma.m16n8k32"): byte i of a[r] is
// A[g + 8*(r&1)][4t + i + 16*(r>>1)], byte i of b[r] is B[4t + i + 16*r][g]. A NaN code
// (0x7F / 0xFF) makes its products NaN, as on the hardware.
void mma_e4m3_fn(Warp& w) {
  float A[16][32], B[32][8];
  for (int l = 0; l < 32; ++l) {
    const auto* x = static_cast<const MmaArgs*>(w.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i)
        A[g + 8 * (r & 1)][4 * t + i + 16 * (r >> 1)] =
            ::va::host::e4m3_to_float(static_cast<uint8_t>(x->a[r] >> (8 * i)));
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 4; ++i)
        B[4 * t + i + 16 * r][g] = ::va::host::e4m3_to_float(static_cast<uint8_t>(x->b[r] >> (8 * i)));
  }
  mma_finish(w, A, B);
}
const WarpOp kMmaE4m3{"mma.m16n8k32.e4m3", mma_e4m3_fn};

// ldmatrix.m8n8.x{1,2,4}{,.trans}.b16 (PTX ISA, "ldmatrix"): lane 8j+i gives
// row i of matrix j; lane l receives in r[j] elements (l/4, 2(l%4)+{0,1}) of
// matrix j, or with .trans elements (2(l%4)+{0,1}, l/4).
struct LdmArgs {
  uint32_t* r;
  const void* row;
  std::source_location loc;
};

template <int kNum, bool kTrans>
void ldmatrix_fn(Warp& w) {
  uint16_t M[4][8][8];
  for (int j = 0; j < kNum; ++j) {
    for (int i = 0; i < 8; ++i) {
      const int l = 8 * j + i;
      const auto* x = static_cast<const LdmArgs*>(w.args[l]);
      Fiber* lf = &w.block->fibers[w.first_tid + l];
      if (check_smem(lf, x->row, 16, "ldmatrix row", x->loc)) std::memcpy(M[j][i], x->row, 16);
      else std::memset(M[j][i], 0xFF, 16);
    }
  }
  for (int l = 0; l < 32; ++l) {
    auto* x = static_cast<LdmArgs*>(w.args[l]);
    const int q = l >> 2, p = 2 * (l & 3);
    for (int j = 0; j < kNum; ++j) {
      const uint16_t lo = kTrans ? M[j][p][q] : M[j][q][p];
      const uint16_t hi = kTrans ? M[j][p + 1][q] : M[j][q][p + 1];
      x->r[j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}
const WarpOp kLdm[2][3] = {
    {{"ldmatrix.x1", ldmatrix_fn<1, false>}, {"ldmatrix.x2", ldmatrix_fn<2, false>},
     {"ldmatrix.x4", ldmatrix_fn<4, false>}},
    {{"ldmatrix.x1.trans", ldmatrix_fn<1, true>}, {"ldmatrix.x2.trans", ldmatrix_fn<2, true>},
     {"ldmatrix.x4.trans", ldmatrix_fn<4, true>}},
};

// shfl.sync.{bfly,idx}.b32 with c = 0x1f (CUDA's width 32): only b[4:0] is
// used, so the source lane is lane ^ (b & 31) or b & 31, always in the warp.
struct ShflArgs {
  uint32_t v;
  int arg;
  uint32_t* out;
};
template <bool kXor>
void shfl_fn(Warp& w) {
  uint32_t v[32];
  for (int l = 0; l < 32; ++l) v[l] = static_cast<const ShflArgs*>(w.args[l])->v;
  for (int l = 0; l < 32; ++l) {
    auto* x = static_cast<ShflArgs*>(w.args[l]);
    const int b = x->arg & 31;
    *x->out = v[kXor ? (l ^ b) : b];
  }
}
const WarpOp kShflXor{"shfl.bfly", shfl_fn<true>};
const WarpOp kShflIdx{"shfl.idx", shfl_fn<false>};

struct VoteArgs {
  bool p;
  uint32_t* out;
};
template <VoteKind kKind>
void vote_fn(Warp& w) {
  uint32_t ballot = 0;
  for (int l = 0; l < 32; ++l) {
    if (static_cast<const VoteArgs*>(w.args[l])->p) ballot |= 1u << l;
  }
  uint32_t r = ballot;
  if (kKind == VoteKind::kAny) r = ballot != 0u;
  if (kKind == VoteKind::kAll) r = ballot == 0xffffffffu;
  for (int l = 0; l < 32; ++l) *static_cast<VoteArgs*>(w.args[l])->out = r;
}
const WarpOp kBallot{"vote.ballot", vote_fn<VoteKind::kBallot>};
const WarpOp kAny{"vote.any", vote_fn<VoteKind::kAny>};
const WarpOp kAll{"vote.all", vote_fn<VoteKind::kAll>};

void nothing_fn(Warp&) {}
const WarpOp kWarpSync{"warp_sync", nothing_fn};

// ---------------------------------------------------------------------------
// wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"), one warp's part

// A copy this thread's cp.async landed: the async proxy (wgmma) may read it only after this thread's
// next fence_proxy_async (and a barrier, which the caller's data flow needs anyway).
// An async-proxy write (a cp.async or bulk copy landing) replaces the st_shared bytes it covers: their marks go.
void clear_generic(Block& b, size_t off, size_t bytes) {
  for (size_t w = off / 4; w < (off + bytes + 3) / 4 && w < b.word_writer.size(); ++w) b.word_writer[w] = 0;
}

void mark_landed(Fiber* f, const unsigned char* dst, int bytes) {
  Block& b = *f->block;
  const size_t off = static_cast<size_t>(dst - b.smem);
  for (size_t c = off / 16; c <= (off + bytes - 1) / 16 && c < b.chunk_writer.size(); ++c) {
    b.chunk_writer[c] = f->tc.linear_tid + 1;
    b.chunk_epoch[c] = f->proxy_fences;
  }
  clear_generic(b, off, static_cast<size_t>(bytes));
}

struct WgmmaArgs {
  int n, kind;  // kind: WgmmaKind (device.h)
  bool trans_b, accumulate;
  float* d;
  const uint32_t* a;  // nullptr: A from shared memory (desc_a)
  uint64_t desc_a, desc_b;
};

struct Desc {
  size_t start, lbo, sbo;
  unsigned w = 1;      // 16-byte chunks per swizzle row: 1 (no swizzle), 2 / 4 / 8 (32 / 64 / 128-byte swizzle)
  unsigned bits = 0;   // log2(w): the XOR's width (CUTLASS Swizzle<bits, 4, 3>)
};

// Decodes a matrix descriptor: no swizzle, or the 128 / 64 / 32-byte swizzles (mode 1 / 2 / 3) with base offset 0.
Desc decode_desc(Fiber* f, uint64_t desc, const char* which, std::source_location loc) {
  const unsigned swz = static_cast<unsigned>(desc >> 62), base = static_cast<unsigned>((desc >> 49) & 7);
  if (base != 0) {
    fatal(f, std::string("wgmma ") + which + " descriptor: base offset " + std::to_string(base) +
                 " (the emulator implements base offset 0: swizzle atoms aligned to their repeat)",
          loc);
  }
  Desc d{static_cast<size_t>(desc & 0x3FFF) << 4, static_cast<size_t>((desc >> 16) & 0x3FFF) << 4,
         static_cast<size_t>((desc >> 32) & 0x3FFF) << 4};
  if (swz != 0) {
    d.bits = 4 - swz;   // mode 1: 128 B (3 bits), 2: 64 B, 3: 32 B
    d.w = 1u << d.bits;
  }
  return d;
}

// A swizzled layout's XOR: bits [4, 4 + bits) of the shared offset ^= bits [7, 7 + bits) (the offset counted from
// the dynamic shared memory's start, which a kernel using swizzled operands keeps aligned to 1024 bytes).
size_t swizzled(const Desc& d, size_t off) {
  return d.bits ? off ^ (((off >> 7) & ((1u << d.bits) - 1u)) << 4) : off;
}

// The 16-byte chunk of a K-major operand holding row `row`'s k chunk `kb` (0 or 1 of the op's two). PTX canonical
// layouts in 16-byte units (CUTLASS make_gmma_desc): no swizzle ((8,m),2):((1,SBO),LBO); swizzled
// ((8,m),2):((w,SBO),1), then the XOR.
size_t kmajor_chunk(const Desc& d, int row, int kb) {
  if (d.bits == 0) return d.start + (row % 8) * 16 + (row / 8) * d.sbo + kb * d.lbo;
  return swizzled(d, d.start + (row % 8) * 16 * d.w + (row / 8) * d.sbo + kb * 16);
}

// The 16-byte chunk of an MN-major (16-bit) operand holding n = 8 nb .. 8 nb + 7 of k: no swizzle
// ((1,n),(8,k)):((.,SBO),(1,LBO)); swizzled ((w,n),(8,k)):((1,LBO),(w,SBO)), then the XOR.
size_t mnmajor_chunk(const Desc& d, int nb, int k) {
  if (d.bits == 0) return d.start + (k % 8) * 16 + nb * d.sbo + (k / 8) * d.lbo;
  return swizzled(d, d.start + (nb % d.w) * 16 + (nb / d.w) * d.lbo + (k % 8) * 16 * d.w + (k / 8) * d.sbo);
}

// A read through the async proxy (a wgmma operand, a bulk copy's source) of the 16-byte chunk at shared offset `off`
// (16-aligned, in bounds) of the calling thread's block: bytes a cp.async landed there need their copying thread's
// fence_proxy_async since the landing (chunk_writer / chunk_epoch; a cp.async tied to an mbarrier phase that was
// waited for needs none), bytes an st_shared wrote need their writer's fence_proxy_async since the store, and before
// any release that published them (word_writer / word_epoch). `reader`: "the wgmma's", "the bulk copy's".
void check_async_proxy_read(Fiber* f, size_t off, const char* which, const char* reader, std::source_location loc) {
  Block& b = *f->block;
  const size_t c = off / 16;
  if (b.chunk_writer[c] != 0) {
    const Fiber& w = b.fibers[b.chunk_writer[c] - 1];
    if (w.proxy_fences <= b.chunk_epoch[c]) {
      fatal(f, std::string(which) + " at shared offset " + std::to_string(off) + " was written by a cp.async of thread " +
                   std::to_string(b.chunk_writer[c] - 1) + " that has not executed fence_proxy_async since it landed (" +
                   reader + " async proxy may not see it)",
            loc);
    }
  }
  for (size_t w = 4 * c; w < 4 * c + 4; ++w) {
    if (b.word_writer[w] == 0) continue;
    const Fiber& gw = b.fibers[b.word_writer[w] - 1];
    if (b.word_released[w] || gw.proxy_fences <= b.word_epoch[w]) {
      const bool released = b.word_released[w];
      fatal(f, std::string(which) + " at shared offset " + std::to_string(off) + ": bytes " + std::to_string(4 * w) +
                   ".." + std::to_string(4 * w + 3) + " were written by st.shared of thread " +
                   std::to_string(b.word_writer[w] - 1) +
                   (released ? " and published by a barrier or mbarrier arrive before its fence_proxy_async"
                             : " without fence_proxy_async since") +
                   " (a generic-proxy write " + reader + " async proxy may not see)",
            loc);
    }
  }
}

// A write through the async proxy (a bulk copy's destination: `bytes` at shared offset `off` of block `t`, the
// caller's or another CTA's of its cluster) over bytes an st_shared wrote: their writer must have executed
// fence_proxy_async since the store (word_epoch; a release between the store and the fence, such as a hand-off
// to another warp, does not matter here: the fence orders the store before the copy once the release that frees the
// bytes for the copy follows it), else the generic write may land after the copy's. (PTX: accesses to the same memory
// through different proxies are ordered only by a proxy fence.) A fence after the freeing release is a bug this check
// does not see when the emulator runs the fence before the copy's issue.
void check_async_proxy_write(Fiber* f, const Block& t, size_t off, size_t bytes, const char* which,
                             std::source_location loc) {
  // bytes a cp.async (the generic proxy) landed, not tied to an mbarrier phase: their copying thread's fence since
  for (size_t c = off / 16; c <= (off + bytes - 1) / 16 && c < t.chunk_writer.size(); ++c) {
    if (t.chunk_writer[c] == 0) continue;
    const Fiber& cw = t.fibers[t.chunk_writer[c] - 1];
    if (cw.proxy_fences <= t.chunk_epoch[c]) {
      fatal(f, std::string(which) + " at shared offset " + std::to_string(off) +
                   (&t == f->block ? "" : " of another CTA") + ": bytes " + std::to_string(16 * c) + ".." +
                   std::to_string(16 * c + 15) + " were landed by a cp.async of thread " +
                   std::to_string(t.chunk_writer[c] - 1) + " that has not executed fence_proxy_async since (the"
                   " async proxy's write may land before that generic-proxy write)",
            loc);
    }
  }
  for (size_t w = off / 4; w < (off + bytes + 3) / 4 && w < t.word_writer.size(); ++w) {
    if (t.word_writer[w] == 0) continue;
    const Fiber& gw = t.fibers[t.word_writer[w] - 1];
    if (gw.proxy_fences <= t.word_epoch[w]) {
      fatal(f, std::string(which) + " at shared offset " + std::to_string(off) +
                   (&t == f->block ? "" : " of another CTA") + ": bytes " + std::to_string(4 * w) + ".." +
                   std::to_string(4 * w + 3) +
                   " were written by st.shared of thread " + std::to_string(t.word_writer[w] - 1) +
                   " without fence_proxy_async since (the async proxy's write may land before that generic-proxy"
                   " write)",
            loc);
    }
  }
}

// Reads one 16-byte core-matrix row at shared offset `off` into out[] (8 16-bit or 16 e4m3 elements): bounds,
// alignment and async-proxy visibility checked; records the bytes for the retire-time check.
template <int kKind>
void read_core_row(Fiber* f, size_t off, float* out, WgmmaOp& op, const char* which, std::source_location loc) {
  Block& b = *f->block;
  const unsigned char* p = b.smem + off;
  if (!check_smem(f, p, 16, which, loc)) fatal(f, std::string(which) + ": bad shared address", loc);
  check_async_proxy_read(f, off, which, "the wgmma's", loc);
  if constexpr (kKind == kWgmmaE4m3) {
    for (int i = 0; i < 16; ++i) out[i] = ::va::host::e4m3_to_float(p[i]);
  } else {
    uint16_t h[8];
    std::memcpy(h, p, 16);
    for (int i = 0; i < 8; ++i) out[i] = half_bits_to_float<kKind == kWgmmaBf16>(h[i]);
  }
  op.read_at.push_back(p);
  op.read_bytes.insert(op.read_bytes.end(), p, p + 16);
}

const WgmmaOp* find_pending(const Warp& w, const float* d) {
  for (auto it = w.wg_open.rbegin(); it != w.wg_open.rend(); ++it)
    if (it->d[0] == d) return &*it;
  for (auto g = w.wg_committed.rbegin(); g != w.wg_committed.rend(); ++g)
    for (auto it = g->rbegin(); it != g->rend(); ++it)
      if (it->d[0] == d) return &*it;
  return nullptr;
}

// k16 (16-bit) or k32 (e4m3): either way two 16-byte core-matrix rows along k per row of A / B (K-major)
template <int kKind>
void wgmma_compute(Warp& w, const WgmmaArgs& x0, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *w.block;
  constexpr int kK = kKind == kWgmmaE4m3 ? 32 : 16, kPerRow = kK / 2;  // k of the op; elements per core row
  const int n = x0.n, nd = n / 2, q = w.index % 4;
  WgmmaOp op;
  op.n = n;
  op.loc = loc;
  // A: rows 16q .. 16q+15 of the warpgroup's 64
  std::vector<float> A(16 * kK), B(kK * static_cast<size_t>(n));
  if (x0.a != nullptr) {  // the A fragment of mma.m16n8k16 (16-bit) / mma.m16n8k32 (e4m3: byte i of a[r] is k 4t + i)
    for (int l = 0; l < 32; ++l) {
      const auto* x = static_cast<const WgmmaArgs*>(w.args[l]);
      const int g = l >> 2, t = l & 3;
      for (int r = 0; r < 4; ++r) {
        if constexpr (kKind == kWgmmaE4m3) {
          for (int i = 0; i < 4; ++i)
            A[(g + 8 * (r & 1)) * kK + 4 * t + i + 16 * (r >> 1)] =
                ::va::host::e4m3_to_float(static_cast<uint8_t>(x->a[r] >> (8 * i)));
        } else {
          for (int h = 0; h < 2; ++h)
            A[(g + 8 * (r & 1)) * kK + 2 * t + h + 8 * (r >> 1)] =
                half_bits_to_float<kKind == kWgmmaBf16>(static_cast<uint16_t>(x->a[r] >> (16 * h)));
        }
      }
    }
  } else {  // K-major (kmajor_chunk): row m's k chunk kb holds elements k = kPerRow kb .. kPerRow kb + kPerRow - 1
    const Desc da = decode_desc(f, x0.desc_a, "A", loc);
    for (int r = 0; r < 16; ++r)
      for (int kb = 0; kb < 2; ++kb)
        read_core_row<kKind>(f, kmajor_chunk(da, 16 * q + r, kb), &A[r * kK + kPerRow * kb], op, "wgmma A row", loc);
  }
  const Desc db = decode_desc(f, x0.desc_b, "B", loc);
  float row[16];
  if (!x0.trans_b) {  // K-major (kmajor_chunk)
    for (int c = 0; c < n; ++c)
      for (int kb = 0; kb < 2; ++kb) {
        read_core_row<kKind>(f, kmajor_chunk(db, c, kb), row, op, "wgmma B row", loc);
        for (int i = 0; i < kPerRow; ++i) B[(kPerRow * kb + i) * n + c] = row[i];
      }
  } else if constexpr (kKind == kWgmmaE4m3) {
    fatal(f, "wgmma .e4m3: B must be K-major (the PTX ISA allows the transposed layouts for 16-bit types only)", loc);
  } else {  // MN-major (mnmajor_chunk): the chunk of n block nb at k holds n = 8 nb + (0..7)
    for (int k = 0; k < 16; ++k)
      for (int nb = 0; nb < n / 8; ++nb) {
        read_core_row<kKind>(f, mnmajor_chunk(db, nb, k), row, op, "wgmma B row", loc);
        for (int i = 0; i < 8; ++i) B[k * n + 8 * nb + i] = row[i];
      }
  }
  // C: the pending op accumulating into the same registers, else the registers themselves
  std::vector<float> C(32 * static_cast<size_t>(nd), 0.f);
  if (x0.accumulate) {
    const WgmmaOp* prev = find_pending(w, x0.d);
    if (prev != nullptr && prev->n != n) {
      fatal(f, "wgmma accumulates into registers that an in-flight wgmma of another shape (m64n" +
                   std::to_string(prev->n) + ") writes" + where(prev->loc),
            loc);
    }
    for (int l = 0; l < 32; ++l) {
      const auto* x = static_cast<const WgmmaArgs*>(w.args[l]);
      for (int i = 0; i < nd; ++i) C[l * nd + i] = prev != nullptr ? prev->result[l * nd + i] : x->d[i];
    }
  }
  op.result.assign(32 * static_cast<size_t>(nd), 0.f);
  for (int l = 0; l < 32; ++l) {
    auto* x = static_cast<WgmmaArgs*>(w.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < nd; ++i) {
      const int r = g + 8 * ((i % 4) >> 1), c = 8 * (i / 4) + 2 * t + (i & 1);
      double acc = C[l * nd + i];
      for (int k = 0; k < kK; ++k) acc += static_cast<double>(A[r * kK + k]) * static_cast<double>(B[k * n + c]);
      op.result[l * nd + i] = static_cast<float>(acc);
    }
    op.d[l] = x->d;
    for (int i = 0; i < nd; ++i) x->d[i] = std::numeric_limits<float>::quiet_NaN();  // valid only after the wait
  }
  w.wg_open.push_back(std::move(op));
  ++b.mmas;
}

void wgmma_fn(Warp& w) {
  Fiber* f = cur_fiber();
  Block& b = *w.block;
  const auto& x0 = *static_cast<const WgmmaArgs*>(w.args[0]);
  const std::source_location loc = w.op_loc;
  for (int l = 1; l < 32; ++l) {
    const auto& x = *static_cast<const WgmmaArgs*>(w.args[l]);
    if (x.n != x0.n || x.kind != x0.kind || x.trans_b != x0.trans_b || x.accumulate != x0.accumulate ||
        (x.a == nullptr) != (x0.a == nullptr) || x.desc_b != x0.desc_b || (x0.a == nullptr && x.desc_a != x0.desc_a)) {
      fatal(f, "wgmma: lane " + std::to_string(l) + " passes a different shape, descriptor or scale-d than lane 0 "
                   "(they must be warp-uniform)",
            loc);
    }
  }
  if (b.nthreads % 128 != 0) {
    fatal(f, "wgmma needs whole warpgroups: the block has " + std::to_string(b.nthreads) + " threads", loc);
  }
  if (!w.wg_fenced) {
    fatal(f, "wgmma without a wgmma_fence since this warp's last wgmma_wait (or its start): the registers it "
             "reads may not be ordered with earlier instructions",
          loc);
  }
  // the 4 warps of the warpgroup must issue the same sequence
  WgLog& lg = b.wg_logs[w.index / 4];
  const WgSig sig{x0.n, x0.kind, x0.a == nullptr, x0.trans_b, x0.accumulate, x0.a == nullptr ? x0.desc_a : 0, x0.desc_b};
  const long long k = w.wg_issued++;
  if (k - lg.base < static_cast<long long>(lg.sigs.size())) {
    if (!(lg.sigs[k - lg.base] == sig)) {
      fatal(f, "wgmma #" + std::to_string(k) + " of warp " + std::to_string(w.index) +
                   " differs (shape, A source, descriptors or scale-d) from the same wgmma of another warp of "
                   "warpgroup " + std::to_string(w.index / 4),
            loc);
    }
  } else {
    lg.sigs.push_back(sig);
  }
  long long lo = k + 1;
  for (int i = 0; i < 4; ++i) {
    const size_t wi = static_cast<size_t>(4 * (w.index / 4) + i);
    if (wi < b.warps.size()) lo = std::min(lo, b.warps[wi].wg_issued);
  }
  while (lg.base < lo && !lg.sigs.empty()) {
    lg.sigs.pop_front();
    ++lg.base;
  }
  if (x0.kind == kWgmmaE4m3) wgmma_compute<kWgmmaE4m3>(w, x0, loc);
  else if (x0.kind == kWgmmaBf16) wgmma_compute<kWgmmaBf16>(w, x0, loc);
  else wgmma_compute<kWgmmaF16>(w, x0, loc);
}
const WarpOp kWgmma{"wgmma.mma_async", wgmma_fn};

void wgmma_fence_fn(Warp& w) { w.wg_fenced = true; }
const WarpOp kWgmmaFence{"wgmma.fence", wgmma_fence_fn};

void wgmma_commit_fn(Warp& w) {
  w.wg_committed.push_back(std::move(w.wg_open));
  w.wg_open.clear();
}
const WarpOp kWgmmaCommit{"wgmma.commit_group", wgmma_commit_fn};

void wgmma_wait_fn(Warp& w) {
  Fiber* f = cur_fiber();
  const int n = *static_cast<const int*>(w.args[0]);
  while (w.wg_committed.size() > static_cast<size_t>(n)) {
    for (const WgmmaOp& op : w.wg_committed.front()) {
      for (size_t i = 0; i < op.read_at.size(); ++i) {
        if (std::memcmp(op.read_at[i], &op.read_bytes[16 * i], 16) != 0) {
          fatal(f, "shared memory at offset " + std::to_string(op.read_at[i] - w.block->smem) +
                       ", an operand of the wgmma issued" + where(op.loc) +
                       ", was overwritten before the wgmma_wait that retires it",
                w.op_loc);
        }
      }
      const int nd = op.n / 2;
      for (int l = 0; l < 32; ++l) std::memcpy(op.d[l], &op.result[l * nd], sizeof(float) * nd);
    }
    w.wg_committed.pop_front();
  }
  w.wg_fenced = false;
}
const WarpOp kWgmmaWait{"wgmma.wait_group", wgmma_wait_fn};

// ---------------------------------------------------------------------------
// scheduler

void fiber_entry(void* arg) {
  auto* f = static_cast<Fiber*>(arg);
  try {
    (*g_launch->body)();
  } catch (const std::exception& e) {
    report(*f->block, f, std::string("exception in kernel: ") + e.what(), std::source_location());
    f->block->abort = true;
  } catch (...) {
    report(*f->block, f, "unknown exception in kernel", std::source_location());
    f->block->abort = true;
  }
  // Copies never waited for are dropped: nothing may read them after exit.
  f->done = true;
  --f->block->live;
  yield(f);
  std::abort();  // a finished fiber is never resumed
}

// What each unfinished thread is stuck on, grouped, for the deadlock report.
std::string describe_stuck(const Block& b) {
  std::map<std::string, int> groups;
  int exited = 0;
  for (int t = 0; t < b.nthreads; ++t) {
    const Fiber& f = b.fibers[t];
    if (f.done) {
      ++exited;
      continue;
    }
    std::string k;
    if (f.wait == WaitKind::kBarrier) k = "block_sync" + where(f.wait_loc);
    else if (f.wait == WaitKind::kMbarrier)
      k = "mbarrier_wait (barrier at smem offset " + std::to_string(f.wait_mbar) + ", parity " +
          std::to_string(f.wait_parity) + ")" + where(f.wait_loc);
    else if (f.wait == WaitKind::kNamed)
      k = "named barrier " + std::to_string(f.wait_named) + " (" + std::to_string(b.named[f.wait_named].arrived) +
          " of " + std::to_string(b.named[f.wait_named].count) + " threads arrived)" + where(f.wait_loc);
    else if (f.wait == WaitKind::kWarp)
      k = "warp " + std::to_string(f.tc.warp) + " in " + b.warps[f.tc.warp].op->name + where(f.wait_loc);
    else if (f.wait == WaitKind::kCluster)
      k = "cluster_sync (" + std::to_string(b.cluster->sync_arrived) + " of " + std::to_string(b.cluster->nthreads) +
          " threads of the cluster arrived)" + where(f.wait_loc);
    else k = "running";
    ++groups[k];
  }
  std::string s;
  for (const auto& [k, n] : groups) s += std::to_string(n) + " thread(s) wait at " + k + "; ";
  s += std::to_string(exited) + " of " + std::to_string(b.nthreads) + " thread(s) exited";
  return s;
}

// ---------------------------------------------------------------------------
// crash report: a wild pointer in kernel code (raw shared-memory indexing past
// the red zone, a fiber stack overflow into its guard page) kills the process;
// say which emulated thread did it first, then let the previous handler (e.g.
// Python's faulthandler) or the default action run.

struct sigaction g_prev_segv, g_prev_bus;

void crash_handler(int sig, siginfo_t* info, void* uctx) {
  if (const ThreadCtx* c = tls_cur) {
    char buf[320];
    const auto* f = static_cast<const Fiber*>(c->fiber);
    const int n = std::snprintf(
        buf, sizeof(buf),
        "\nva::emu: %s in an emulated kernel at address %p: block (%u,%u,%u) thread (%u,%u,%u) [warp %d lane %d];"
        " block shared memory is [%p, +%zu)\n",
        sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", info->si_addr, c->block_idx.x, c->block_idx.y, c->block_idx.z,
        c->thread_idx.x, c->thread_idx.y, c->thread_idx.z, c->warp, c->lane, static_cast<void*>(c->smem),
        f != nullptr && f->block != nullptr ? f->block->smem_bytes : size_t(0));
    if (n > 0) (void)!write(2, buf, static_cast<size_t>(n));
  }
  const struct sigaction& prev = sig == SIGSEGV ? g_prev_segv : g_prev_bus;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, uctx);
  } else if (prev.sa_handler != SIG_IGN && prev.sa_handler != SIG_DFL && prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
  }
  signal(sig, SIG_DFL);  // re-raised when the faulting instruction runs again
}

void install_crash_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
    sigaction(SIGBUS, &sa, &g_prev_bus);
  });
  // An alternate signal stack per OS thread: a fiber stack overflow leaves no
  // room on the faulting stack to run the handler.
  thread_local std::unique_ptr<char[]> alt;
  if (!alt) {
    constexpr size_t kAlt = 64 * 1024;
    alt.reset(new char[kAlt]);
    stack_t ss{};
    ss.ss_sp = alt.get();
    ss.ss_size = kAlt;
    sigaltstack(&ss, nullptr);
  }
}

class Worker {
 public:
  // Runs cluster `ci` of the grid (clusters numbered x fastest over the grid of clusters; a launch without clusters
  // has clusters of one block, so `ci` is the block's linear index): its CTAs together, their threads interleaved by
  // one scheduler loop, each CTA with its own shared memory, fibers, barriers and end-of-block checks.
  void run_cluster(long long ci, const LaunchState& st) {
    const Settings& cfg = settings();
    const dim3 g = st.grid, bd = st.block, cd = st.cluster;
    const int nthreads = static_cast<int>(bd.x * bd.y * bd.z);
    const int csize = static_cast<int>(cd.x * cd.y * cd.z);
    const long long ncx = g.x / cd.x, ncy = g.y / cd.y;
    const uint3 cidx = make_uint3(static_cast<unsigned>(ci % ncx), static_cast<unsigned>((ci / ncx) % ncy),
                                  static_cast<unsigned>(ci / (ncx * ncy)));
    // The blocks' addresses stay fixed (fibers, warps and the cluster point at them) until all are done.
    std::vector<Block> blocks(static_cast<size_t>(csize));
    Cluster cl;
    cl.dims = cd;
    cl.size = csize;
    cl.nthreads = csize * nthreads;
    while (stacks_.size() < static_cast<size_t>(csize) * nthreads) {
      stacks_.push_back(std::make_unique<Stack>(cfg.stack_bytes));
    }
    while (smem_.size() < static_cast<size_t>(csize)) {
      smem_.emplace_back();
      smem_cap_.push_back(0);
    }
    fibers_.clear();
    fibers_.resize(static_cast<size_t>(csize) * nthreads);
    const int nwarps = (nthreads + 31) / 32;
    std::vector<long long> linear(static_cast<size_t>(csize));
    for (int r = 0; r < csize; ++r) {
      Block& b = blocks[r];
      const unsigned x = r % cd.x, y = (r / cd.x) % cd.y, z = r / (cd.x * cd.y);
      b.idx = make_uint3(cidx.x * cd.x + x, cidx.y * cd.y + y, cidx.z * cd.z + z);
      linear[r] = b.idx.x + static_cast<long long>(g.x) * (b.idx.y + static_cast<long long>(g.y) * b.idx.z);
      b.cluster = &cl;
      b.rank = r;
      cl.blocks.push_back(&b);
      b.nthreads = nthreads;
      b.live = nthreads;
      b.smem_bytes = st.smem_bytes;
      b.smem = smem_for(r, st.smem_bytes);
      std::memset(b.smem, 0xFF, st.smem_bytes + kRedZoneBytes);
      b.chunk_writer.assign(st.smem_bytes / 16 + 1, 0);
      b.chunk_epoch.assign(st.smem_bytes / 16 + 1, 0);
      b.word_writer.assign(st.smem_bytes / 4 + 4, 0);
      b.word_epoch.assign(st.smem_bytes / 4 + 4, 0);
      b.word_released.assign(st.smem_bytes / 4 + 4, 0);
      b.wg_logs.assign(static_cast<size_t>((nthreads + 127) / 128), WgLog{});
      b.fibers = fibers_.data() + static_cast<size_t>(r) * nthreads;
      b.warps.resize(nwarps);
      for (int w = 0; w < nwarps; ++w) {
        b.warps[w].block = &b;
        b.warps[w].index = w;
        b.warps[w].first_tid = 32 * w;
        b.warps[w].nlanes = std::min(32, nthreads - 32 * w);
      }
      for (int t = 0; t < nthreads; ++t) {
        Fiber& f = b.fibers[t];
        Stack& stack = *stacks_[static_cast<size_t>(r) * nthreads + t];
        f.block = &b;
        f.tc.thread_idx = make_uint3(t % bd.x, (t / bd.x) % bd.y, t / (bd.x * bd.y));
        f.tc.block_idx = b.idx;
        f.tc.block_dim = bd;
        f.tc.grid_dim = g;
        f.tc.linear_tid = t;
        f.tc.lane = t % 32;
        f.tc.warp = t / 32;
        f.tc.smem = b.smem;
        f.tc.fiber = &f;
        // The stack is reused from earlier blocks: poison its top (where the
        // kernel's frames live) so an uninitialised local reads NaN / -1 the same
        // way every run instead of a previous thread's leftovers.
        const size_t poison = std::min(kStackPoisonBytes, stack.size());
        std::memset(static_cast<char*>(stack.base()) + stack.size() - poison, 0xFF, poison);
        make_context(f.ctx, stack.base(), stack.size(), fiber_entry, &f);
      }
    }

    // forward / reverse / random: each pass resumes every runnable thread once,
    // so warps advance roughly one collective per pass, in lockstep.
    // lagging: forward, but the first third of the warps (at least one) run every other pass only, so the
    // others run twice as far: a warp-specialized kernel's first math warpgroup behind its other roles (a
    // producer that skips a wait then refills a buffer under that warpgroup's last in-flight wgmma).
    // lagging-mid: the same with the middle third held back (a 12-warp kernel's second math warpgroup).
    // lagging-tail: the same with the last warp of every 4 held back: the other warps of a warpgroup run ahead of
    // one of theirs (a warp rewriting a buffer that warp's wgmma of the warpgroup still reads).
    // lagging-head: the first warp of every 4 runs one pass in 4 only: the other three warps of a warpgroup run far
    // ahead of it (a warp rewriting a buffer that the held warp's slice of a wgmma has not read yet: the emulator runs
    // each warp's slice when that warp issues it).
    // stalled-mid / stalled-head: the middle third of the warps / the first warp of every 4 run one pass in 16 only:
    // what lagging-mid / lagging-head show, with a lead long enough for a role to pass a whole pair of the other's
    // steps (Hopper v3's e4m3 warpgroup 0 reading stage 1's rows before its own FULL wait, while warpgroup 1, whose
    // wait on the same phase otherwise comes first, is held back).
    // starve-last: the last third of the warps (a 12-warp kernel's producer warpgroup) run only in passes where no
    // other thread can: a consumer that skips a wait then reads a buffer its producer has not written yet.
    // warp-ahead(-reverse): a warp runs until all its threads wait at a block
    // barrier (or exit) before the next warp moves, so the first (last) warp
    // runs as far ahead of the others as the barriers allow; a missing barrier
    // then lets it read data the others have not produced yet, or overwrite
    // data they have not consumed.
    // A cluster: each pass runs the CTAs one after another in rank order, each as above (its own thread order, held
    // warps and starved warps; warp-ahead: the CTAs' warps in rank order).
    const bool ahead = cfg.schedule == Schedule::kWarpAhead || cfg.schedule == Schedule::kWarpAheadReverse;
    const bool rev = cfg.schedule == Schedule::kReverse || cfg.schedule == Schedule::kWarpAheadReverse;
    std::vector<std::vector<int>> orders(static_cast<size_t>(csize), std::vector<int>(nthreads));
    std::vector<std::mt19937_64> rngs;
    for (int r = 0; r < csize; ++r) {
      for (int t = 0; t < nthreads; ++t) orders[r][t] = rev ? nthreads - 1 - t : t;
      rngs.emplace_back(cfg.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(linear[r]));
    }
    const bool lag = cfg.schedule == Schedule::kLagging || cfg.schedule == Schedule::kLaggingMid;
    const bool lag_tail = cfg.schedule == Schedule::kLaggingTail;
    const bool lag_head = cfg.schedule == Schedule::kLaggingHead;
    const bool stall_mid = cfg.schedule == Schedule::kStalledMid, stall_head = cfg.schedule == Schedule::kStalledHead;
    // stalled-peer: a cluster's CTAs of rank 1 and up run one pass in kStallPeriod, so rank 0 runs far ahead of its
    // peers (a CTA rewriting what it forwards before the peer's phase, which the copy completes on, has completed)
    // stalled-peer-mid: only the middle third of the warps of those CTAs (a 12-warp kernel's second math warpgroup)
    const bool stall_peer = cfg.schedule == Schedule::kStalledPeer;
    const bool stall_peer_mid = cfg.schedule == Schedule::kStalledPeerMid;
    constexpr long long kStallPeriod = 16;
    const int lag_warps = held_warps(nwarps);
    const int lag_first = cfg.schedule == Schedule::kLaggingMid ? lag_warps : 0;
    const bool starve_last = cfg.schedule == Schedule::kStarveLast;
    long long pass = 0;
    int live_blocks = csize;
    bool abort = false;  // some CTA of the cluster was abandoned: the whole cluster stops
    auto resume = [&](Fiber& f) {
      Block& fb = *f.block;
      tls_cur = &f.tc;
      switch_context(fb.sched, f.ctx);  // the fiber yields back to its block's sched
      tls_cur = nullptr;
      if (fb.abort) {
        abort = true;
      } else if (fb.live == 0 && !fb.exited) {  // the CTA's last thread exited: its end-of-block checks
        fb.exited = true;
        --live_blocks;
        check_red_zone(fb);
        check_wgmma_drained(fb);
        check_bulk_drained(fb);
      }
    };
    while (live_blocks > 0 && !abort) {
      bool progress = false, held_back = false;
      for (int r = 0; r < csize && !abort; ++r) {
        Block& b = blocks[r];
        Fiber* fibers = b.fibers;
        if (b.live == 0) continue;
        if (stall_peer && r > 0 && pass % kStallPeriod != 0) {
          held_back = true;  // runnable or not, its turn comes: not a deadlock
          continue;
        }
        if (cfg.schedule == Schedule::kRandom) std::shuffle(orders[r].begin(), orders[r].end(), rngs[r]);
        if (ahead) {
          for (int wi = 0; wi < nwarps && !abort; ++wi) {
            const Warp& w = b.warps[rev ? nwarps - 1 - wi : wi];
            for (bool ran = true; ran && !abort;) {
              ran = false;
              for (int i = 0; i < w.nlanes && !abort; ++i) {
                Fiber& f = fibers[w.first_tid + i];
                if (f.done || f.wait != WaitKind::kNone) continue;
                resume(f);
                ran = progress = true;
              }
            }
          }
        } else {
          // starve-last: the others first; the last warps only when none of the others (of this CTA) could run
          bool block_progress = false;
          for (int round = 0; round < (starve_last ? 2 : 1) && !block_progress && !abort; ++round) {
            for (int t : orders[r]) {
              Fiber& f = fibers[t];
              if (f.done || f.wait != WaitKind::kNone) continue;
              if (((pass & 1) && ((lag && t / 32 >= lag_first && t / 32 < lag_first + lag_warps) ||
                                  (lag_tail && t / 32 % 4 == 3))) ||
                  (lag_head && pass % 4 != 0 && t / 32 % 4 == 0) ||
                  (pass % kStallPeriod != 0 &&
                   (((stall_mid || (stall_peer_mid && r > 0)) && t / 32 >= lag_warps && t / 32 < 2 * lag_warps) ||
                    (stall_head && t / 32 % 4 == 0)))) {
                held_back = true;  // runnable, its turn is the next pass: not a deadlock
                continue;
              }
              if (starve_last && (t / 32 >= nwarps - lag_warps) != (round == 1)) continue;
              resume(f);
              progress = block_progress = true;
              if (abort) break;
            }
          }
        }
      }
      ++pass;
      if (!progress && !held_back && !abort) {
        // no thread of any CTA of the cluster can run
        Block* first = nullptr;
        for (Block& b : blocks)
          if (b.live > 0 && first == nullptr) first = &b;
        std::string what = "deadlock: ";
        if (csize == 1) {
          what += describe_stuck(*first);
        } else {
          what += "no thread of the cluster's " + std::to_string(csize) + " CTAs can run:";
          for (const Block& b : blocks)
            what += " CTA rank " + std::to_string(b.rank) + " (block (" + std::to_string(b.idx.x) + "," +
                    std::to_string(b.idx.y) + "," + std::to_string(b.idx.z) + ")): " + describe_stuck(b) + ".";
        }
        report(*first, nullptr, what, std::source_location());
        first->abort = true;
        abort = true;
      }
    }
    for (const Block& b : blocks) {
      blocks_ += 1;
      threads_ += nthreads;
      syncs_ += b.syncs;
      collectives_ += b.collectives;
      mmas_ += b.mmas;
      cp_bytes_ += b.cp_bytes;
      l2_prefetches_ += b.l2_prefetches;
      cp_src_bytes_ += b.cp_src_bytes;
      cp_src_prefetched_ += b.cp_src_prefetched;
      cp16_src_prefetched_ += b.cp16_src_prefetched;
    }
  }

  void merge_stats(Stats& s) const {
    s.blocks += blocks_;
    s.threads += threads_;
    s.block_syncs += syncs_;
    s.warp_collectives += collectives_;
    s.mma += mmas_;
    s.cp_async_bytes += cp_bytes_;
    s.l2_prefetches += l2_prefetches_;
    s.cp_async_src_bytes += cp_src_bytes_;
    s.cp_async_src_prefetched += cp_src_prefetched_;
    s.cp_async16_src_prefetched += cp16_src_prefetched_;
  }

 private:
  // the shared memory of the cluster's CTA `rank` (one buffer per rank, reused by the worker's later clusters)
  unsigned char* smem_for(int rank, size_t bytes) {
    const size_t need = bytes + kRedZoneBytes;
    if (need > smem_cap_[rank]) {
      smem_[rank].reset(static_cast<unsigned char*>(std::aligned_alloc(128, (need + 127) / 128 * 128)));
      if (!smem_[rank]) throw std::bad_alloc();
      smem_cap_[rank] = need;
    }
    return smem_[rank].get();
  }

  void check_wgmma_drained(const Block& b) {
    for (const Warp& w : b.warps) {
      size_t n = w.wg_open.size();
      for (const auto& g : w.wg_committed) n += g.size();
      if (n > 0) {
        const WgmmaOp& op = w.wg_open.empty() ? w.wg_committed.front().front() : w.wg_open.front();
        report(b, &b.fibers[w.first_tid],
               std::to_string(n) + " wgmma op(s) of warp " + std::to_string(w.index) +
                   " still in flight when its threads exited (no wgmma_wait retired them; first issued" +
                   where(op.loc) + ")",
               std::source_location());
        return;
      }
    }
  }
  // A CTA must not exit with copies in flight into its shared memory: every phase that copies went to (bulk copies,
  // and cp.asyncs tied to it by cp.async.mbarrier.arrive.noinc) must have completed, and some thread must have
  // waited for it, so that the copies have landed before the shared memory goes to another CTA. (Landing "wait"
  // lands a completed phase's copies at the first wait; until then they are `unlanded`: with no wait, still in flight.)
  void check_bulk_drained(const Block& b) {
    for (const auto& [off, m] : b.mbars) {
      const long long deferred = deferred_bytes(m);  // (copies from another CTA: counted when they complete)
      if (!m.copies.empty() || !m.deferred.empty() || m.tx != 0) {
        report(b, nullptr,
               "mbarrier at smem offset " + std::to_string(off) + " (initialised" + where(m.init_loc) +
                   ") has a phase that never completed when the block exited: " +
                   std::to_string(m.pending) + " arrival(s) and " + std::to_string(m.tx - deferred) +
                   " transaction byte(s) still due, " + std::to_string(m.copies.size() + m.deferred.size()) +
                   " bulk copy(ies) in flight",
               std::source_location());
        return;
      }
      if (!m.unlanded.empty()) {
        report(b, nullptr,
               "mbarrier at smem offset " + std::to_string(off) + " (initialised" + where(m.init_loc) + "): " +
                   std::to_string(m.unlanded.size()) +
                   " copy(ies) of a completed phase that no thread waited for when the block exited (still in "
                   "flight into shared memory the CTA gives up)",
               std::source_location());
        return;
      }
    }
  }
  void check_red_zone(const Block& b) {
    for (size_t i = 0; i < kRedZoneBytes; ++i) {
      if (b.smem[b.smem_bytes + i] != 0xFF) {
        report(b, nullptr,
               "shared memory written past the launch's " + std::to_string(b.smem_bytes) +
                   " bytes of dynamic shared memory (first changed byte at offset " +
                   std::to_string(b.smem_bytes + i) + ")",
               std::source_location());
        return;
      }
    }
  }

  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<Stack>> stacks_;
  std::vector<Fiber> fibers_;
  std::vector<std::unique_ptr<unsigned char, FreeDeleter>> smem_;  // per cluster rank
  std::vector<size_t> smem_cap_;
  long long blocks_ = 0, threads_ = 0, syncs_ = 0, collectives_ = 0, mmas_ = 0, cp_bytes_ = 0;
  long long l2_prefetches_ = 0, cp_src_bytes_ = 0, cp_src_prefetched_ = 0, cp16_src_prefetched_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------
// device-side entry points

// Fault injection: true (and counted) when this call, the thread's `calls`-th of its kind, is one
// set_fault told the emulator to skip.
static bool skipped_by_fault(FaultKind kind, int& calls) {
  const int k = calls++;
  const Settings& cfg = settings();
  const int tid = cur_fiber()->tc.linear_tid;
  if (cfg.fault == kind && (cfg.fault_nth < 0 || cfg.fault_nth == k) && tid >= cfg.fault_tid_lo &&
      tid < cfg.fault_tid_hi) {
    ++g_fault_hits;
    return true;
  }
  return false;
}

// A release (block_sync, a named barrier, an mbarrier arrive) by a thread whose st_shared bytes it has not fenced yet:
// the fence must come before the release that publishes them (a reader acquiring through it may run its wgmma before
// any later fence), so those bytes stay invisible to the async proxy until written again (word_released)
void publish_generic(Fiber* f) {
  Block& b = *f->block;
  for (const size_t w : f->unfenced_words)
    if (b.word_writer[w] == f->tc.linear_tid + 1 && b.word_epoch[w] == f->proxy_fences) b.word_released[w] = 1;
  f->unfenced_words.clear();
}

void block_sync(std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  if (skipped_by_fault(FaultKind::kSkipBlockSync, f->block_sync_calls)) return;
  publish_generic(f);
  if (b.barrier_arrived == 0) {
    b.barrier_loc = loc;
  } else if (b.barrier_loc.line() != loc.line() ||
             std::strcmp(b.barrier_loc.file_name(), loc.file_name()) != 0) {
    fatal(f, "divergent block_sync: other threads wait at block_sync" + where(b.barrier_loc), loc);
  }
  if (++b.barrier_arrived == b.nthreads) {
    b.barrier_arrived = 0;
    for (int t = 0; t < b.nthreads; ++t) {
      if (b.fibers[t].wait == WaitKind::kBarrier) b.fibers[t].wait = WaitKind::kNone;
    }
    ++b.syncs;
    return;
  }
  f->wait = WaitKind::kBarrier;
  f->wait_loc = loc;
  yield(f);
}

void named_barrier(int id, int count, bool wait, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  // planted bugs: this call counts one warp fewer than the kernel says, or is not made at all (one counter for both)
  if (settings().fault == FaultKind::kSkipNamedBarrier) {
    if (skipped_by_fault(FaultKind::kSkipNamedBarrier, f->named_barrier_calls)) return;
  } else if (skipped_by_fault(FaultKind::kNamedBarrierMiscount, f->named_barrier_calls)) {
    count -= 32;
  }
  if (id < 1 || id > 15 || count < 32 || count % 32 != 0 || count > b.nthreads) {
    report(b, f, "named barrier " + std::to_string(id) + " with " + std::to_string(count) + " threads: the id must be "
                     "1..15 (0 is block_sync's) and the count a multiple of 32 from 32 to the block's " +
                     std::to_string(b.nthreads), loc);
    return;
  }
  publish_generic(f);
  NamedBar& nb = b.named[id];
  if (nb.arrived == 0) {
    nb.count = count;
    nb.loc = loc;
  } else if (nb.count != count) {
    report(b, f, "named barrier " + std::to_string(id) + ": this thread arrives for " + std::to_string(count) +
                     " threads, the " + std::to_string(nb.arrived) + " before it in this generation for " +
                     std::to_string(nb.count) + where(nb.loc), loc);
    return;
  }
  if (++nb.arrived == nb.count) {
    nb.arrived = 0;
    for (int t = 0; t < b.nthreads; ++t) {
      Fiber& w = b.fibers[t];
      if (w.wait == WaitKind::kNamed && w.wait_named == id) w.wait = WaitKind::kNone;
    }
    return;
  }
  if (!wait) return;
  f->wait = WaitKind::kNamed;
  f->wait_named = id;
  f->wait_loc = loc;
  yield(f);
}

void setmaxnreg(int regs, bool inc, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  const char* what = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
  if (regs < 24 || regs > 256 || regs % 8 != 0) {
    report(b, f, std::string(what) + " " + std::to_string(regs) + ": the count must be a multiple of 8 in 24..256",
           loc);
    return;
  }
  if (b.nthreads % 128 != 0) {
    report(b, f, std::string(what) + ": the block's " + std::to_string(b.nthreads) + " threads are not whole "
                     "warpgroups (setmaxnreg is warpgroup-wide)", loc);
    return;
  }
  const size_t wg = static_cast<size_t>(f->tc.linear_tid / 128);
  if (b.maxnreg.size() <= wg) b.maxnreg.resize(wg + 1);
  const size_t k = static_cast<size_t>(f->setmaxnreg_calls++);
  std::vector<int>& log = b.maxnreg[wg];
  const int v = inc ? regs : -regs;
  if (log.size() <= k) log.push_back(v);
  else if (log[k] != v)
    report(b, f, std::string(what) + " " + std::to_string(regs) + ": warpgroup " + std::to_string(wg) + "'s threads "
                     "disagree (another of its threads gave " + (log[k] > 0 ? "inc " : "dec ") +
                     std::to_string(log[k] > 0 ? log[k] : -log[k]) + " for this call)", loc);
}

void threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

void grid_dependency_wait(std::source_location) { cur_fiber()->dependency_waited = true; }

int atomic_add(int* p, int v, std::source_location loc) {
  Fiber* f = cur_fiber();
  if (!check_global(f, p, sizeof(int), "atomic_add", loc, true)) return 0;
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

void ld_global(void* dst, const void* src, size_t bytes, std::source_location loc) {
  if (check_global(cur_fiber(), src, bytes, "ld_global", loc)) std::memcpy(dst, src, bytes);
  else std::memset(dst, 0xFF, bytes);
}

void st_global(void* dst, const void* src, size_t bytes, std::source_location loc) {
  if (check_global(cur_fiber(), dst, bytes, "st_global", loc, true)) std::memcpy(dst, src, bytes);
}

void st_shared(void* dst, const void* src, size_t bytes, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    report(b, f, "st_shared of " + std::to_string(bytes) + " bytes (4, 8 or 16)", loc);
    return;
  }
  if (!check_smem(f, dst, bytes, "st_shared", loc)) return;
  std::memcpy(dst, src, bytes);
  const size_t off = static_cast<size_t>(static_cast<unsigned char*>(dst) - b.smem);
  for (size_t w = off / 4; w < (off + bytes) / 4; ++w) {
    b.word_writer[w] = f->tc.linear_tid + 1;
    b.word_epoch[w] = f->proxy_fences;
    b.word_released[w] = 0;
    f->unfenced_words.push_back(w);
  }
  // a whole chunk stored: no byte of an earlier cp.async is left in it (a partial store keeps that mark too)
  if (bytes == 16) b.chunk_writer[off / 16] = 0;
}

void cp_async(void* smem_dst, const void* gmem_src, int bytes, bool valid, std::source_location loc) {
  Fiber* f = cur_fiber();
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    report(*f->block, f, "cp.async of " + std::to_string(bytes) + " bytes (cp-size must be 4, 8 or 16)", loc);
    return;
  }
  if (!check_smem(f, smem_dst, bytes, "cp.async destination", loc)) return;
  PendingCopy c;
  c.dst = static_cast<unsigned char*>(smem_dst);
  c.bytes = bytes;
  if (!valid) std::memset(c.data, 0, bytes);
  else if (check_global(f, gmem_src, bytes, "cp.async source", loc)) {
    std::memcpy(c.data, gmem_src, bytes);
    f->block->cp_src_bytes += bytes;
    if (f->block->prefetched_lines.count(reinterpret_cast<uintptr_t>(gmem_src) / 128)) {
      f->block->cp_src_prefetched += bytes;
      if (bytes == 16) f->block->cp16_src_prefetched += bytes;
    }
  } else {
    std::memset(c.data, 0xFF, bytes);
  }
  if (settings().cp_async_at_issue) {
    // the earliest moment the hardware may write the destination: exposes a
    // buffer overwritten while other threads still read it (a missing barrier
    // before reusing a pipeline stage)
    std::memcpy(c.dst, c.data, bytes);
    mark_landed(f, c.dst, bytes);
    f->landed_untied.emplace_back(static_cast<size_t>(c.dst - f->block->smem), bytes);
    f->block->cp_bytes += bytes;
    return;
  }
  f->open_group.push_back(c);
}

void prefetch_l2(const void* gmem, std::source_location loc) {
  // a hint on the hardware, but the kernels prefetch only rows they will copy: an address outside every
  // registered tensor is reported like a load's
  Fiber* f = cur_fiber();
  if (!check_global(f, gmem, 1, "prefetch.global.L2", loc)) return;
  f->block->l2_prefetches += 1;
  f->block->prefetched_lines.insert(reinterpret_cast<uintptr_t>(gmem) / 128);
}

void cp_async_16(void* smem_dst, const void* gmem_src, bool valid, std::source_location loc) {
  cp_async(smem_dst, gmem_src, 16, valid, loc);
}

void cp_async_commit() {
  Fiber* f = cur_fiber();
  f->committed.push_back(std::move(f->open_group));
  f->open_group.clear();
}

void cp_async_wait(int n, std::source_location) {
  Fiber* f = cur_fiber();
  if (skipped_by_fault(FaultKind::kSkipCpAsyncWait, f->cp_async_wait_calls)) return;
  f->landed_untied.clear();
  while (f->committed.size() > static_cast<size_t>(n)) {
    for (const PendingCopy& c : f->committed.front()) {
      std::memcpy(c.dst, c.data, c.bytes);
      mark_landed(f, c.dst, c.bytes);
      f->block->cp_bytes += c.bytes;
    }
    f->committed.pop_front();
  }
}

void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                  const float (&c)[4], std::source_location loc) {
  MmaArgs args{a, b, c, d};
  collective(bf16 ? &kMmaBf16 : &kMmaF16, &args, loc);
}

void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                       std::source_location loc) {
  MmaArgs args{a, b, c, d};
  collective(&kMmaE4m3, &args, loc);
}

void ldmatrix(int num_matrices, bool trans, uint32_t* r, const void* smem_row, std::source_location loc) {
  LdmArgs args{r, smem_row, loc};
  const int k = num_matrices == 1 ? 0 : (num_matrices == 2 ? 1 : 2);
  collective(&kLdm[trans ? 1 : 0][k], &args, loc);
}

void shfl(bool xor_mode, uint32_t v, int arg, uint32_t* out, std::source_location loc) {
  ShflArgs args{v, arg, out};
  collective(xor_mode ? &kShflXor : &kShflIdx, &args, loc);
}

uint32_t vote(VoteKind kind, bool p, std::source_location loc) {
  uint32_t out = 0;
  VoteArgs args{p, &out};
  collective(kind == VoteKind::kBallot ? &kBallot : (kind == VoteKind::kAny ? &kAny : &kAll), &args, loc);
  return out;
}

void warp_sync(std::source_location loc) { collective(&kWarpSync, nullptr, loc); }

uint64_t smem_offset(const void* p) {
  Fiber* f = cur_fiber();
  const Block& b = *f->block;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < b.smem || c >= b.smem + b.smem_bytes) {
    fatal(f, "wgmma_desc: " + hexaddr(p) + " is not in the block's dynamic shared memory", std::source_location());
  }
  return static_cast<uint64_t>(c - b.smem);
}
void wgmma(int n, int kind, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, bool trans_b,
           bool accumulate, std::source_location loc) {
  WgmmaArgs args{n, kind, trans_b, accumulate, d, a, desc_a, desc_b};
  collective(&kWgmma, &args, loc);
}
void wgmma_fence(std::source_location loc) { collective(&kWgmmaFence, nullptr, loc); }
void wgmma_commit(std::source_location loc) { collective(&kWgmmaCommit, nullptr, loc); }
void wgmma_wait(int n, std::source_location loc) {
  Fiber* f = cur_fiber();
  // the same call index in every lane of a warp: a skip is warp-uniform
  if (skipped_by_fault(FaultKind::kSkipWgmmaWait, f->wgmma_wait_calls)) return;
  int arg = n;
  collective(&kWgmmaWait, &arg, loc);
}
void fence_proxy_async() {
  Fiber* f = cur_fiber();
  if (skipped_by_fault(FaultKind::kSkipFenceProxyAsync, f->fence_proxy_calls)) return;
  ++f->proxy_fences;
  f->unfenced_words.clear();
}

// ---- mbarrier and bulk copies (cp.async.bulk) --------------------------------------------------------

namespace {

// The barrier object at shared offset `off` of CTA `t` (the caller's, or another CTA of its cluster), for `what`:
// 8-byte aligned, initialised, and its init visible to the caller. In the caller's own CTA, a block barrier since
// another thread's init; in another CTA, the initialising thread ran fence_mbarrier_init_cluster after the init and a
// cluster_sync completed after that fence. Null after a report.
Mbar* visible_mbar(Fiber* f, Block& t, size_t off, const char* what, std::source_location loc) {
  Block& b = *f->block;
  const std::string of = &t == &b ? "" : " of CTA rank " + std::to_string(t.rank);
  const std::string at = std::string(what) + ": mbarrier at smem offset " + std::to_string(off) + of;
  if (off % 8 != 0) {
    report(b, f, at + " is not 8-byte aligned", loc);
    return nullptr;
  }
  auto it = t.mbars.find(off);
  if (it == t.mbars.end()) {
    report(b, f, std::string(what) + ": no mbarrier_init at smem offset " + std::to_string(off) + of + " before its use",
           loc);
    return nullptr;
  }
  const Mbar& m = it->second;
  if (&t == &b && m.init_tid != f->tc.linear_tid && m.init_syncs == b.syncs) {
    report(b, f, at + " used before a block_sync made thread " + std::to_string(m.init_tid) + "'s mbarrier_init" +
                     where(m.init_loc) + " visible to this thread", loc);
    return nullptr;
  }
  if (&t != &b && (m.cluster_fence < 0 || b.cluster->syncs <= m.cluster_fence)) {
    report(b, f, at + " used before a cluster_sync made thread " + std::to_string(m.init_tid) + "'s mbarrier_init" +
                     where(m.init_loc) + " visible to the cluster (" +
                     (m.cluster_fence < 0 ? "that thread has run no fence_mbarrier_init_cluster since the init"
                                          : "no cluster_sync completed since that thread's fence_mbarrier_init_cluster") +
                     ")", loc);
    return nullptr;
  }
  return &it->second;
}

// The barrier object at `bar` (initialised, 8-byte aligned shared memory of the caller's CTA), or null after a report.
Mbar* mbar_at(Fiber* f, const void* bar, const char* what, std::source_location loc) {
  Block& b = *f->block;
  if (!check_smem(f, bar, 8, what, loc)) return nullptr;
  return visible_mbar(f, b, static_cast<size_t>(static_cast<const unsigned char*>(bar) - b.smem), what, loc);
}


// Bulk copies write through the async proxy: a wgmma may read them without a generic-to-async fence.
void land_one(Block& b, const BulkCopy& c) {
  std::memcpy(c.dst, c.data.data(), c.data.size());
  const size_t off = static_cast<size_t>(c.dst - b.smem);
  for (size_t k = off / 16; k <= (off + c.data.size() - 1) / 16 && k < b.chunk_writer.size(); ++k)
    b.chunk_writer[k] = 0;
  clear_generic(b, off, c.data.size());
  b.cp_bytes += static_cast<long long>(c.data.size());
}

void land_bulk(Block& b, std::vector<BulkCopy>& copies) {
  for (const BulkCopy& c : copies) land_one(b, c);
  copies.clear();
}

bool parity_done(const Mbar& m, unsigned parity) { return (m.completed & 1u) != (parity & 1u); }

// Completes the current phase when its arrivals and transaction bytes are all in; then the waiting threads
// whose phase completed resume, the copies landing first.
void mbar_try_complete(Block& b, Mbar& m) {
  const long long deferred = deferred_bytes(m);
  if (m.pending != 0 || m.tx - deferred != 0) return;
  if (deferred > 0) {  // copies from another CTA: complete only with a thread here waiting on the phase
    bool waiter = false;
    for (int t = 0; t < b.nthreads && !waiter; ++t)
      waiter = b.fibers[t].wait == WaitKind::kMbarrier && b.fibers[t].wait_mbar == m.off;
    if (!waiter) return;
    m.tx -= deferred;
    for (BulkCopy& c : m.deferred) m.copies.push_back(std::move(c));
    m.deferred.clear();
  }
  // a copy from another CTA's shared memory reads its source until the phase completes: its bytes must not have
  // changed since the issue (the issuing CTA rewrote them before the copy was known to be done)
  for (const Mbar::SourceCheck& c : m.sources) {
    if (std::memcmp(c.from->smem + c.off, c.bytes.data(), c.bytes.size()) != 0) {
      report(*c.from, nullptr,
             "cp.async.bulk.shared::cluster source at shared offset " + std::to_string(c.off) + " (+" +
                 std::to_string(c.bytes.size()) + " bytes) was rewritten before the copy's mbarrier phase completed "
                 "in CTA rank " + std::to_string(b.rank) + " (the copy may still read it; issued" + where(c.loc) + ")",
             std::source_location());
      break;
    }
  }
  m.sources.clear();
  for (BulkCopy& c : m.copies) m.unlanded.push_back(std::move(c));
  m.copies.clear();
  ++m.completed;
  m.pending = m.count;
  bool woke = false;
  for (int t = 0; t < b.nthreads; ++t) {
    Fiber& w = b.fibers[t];
    if (w.wait == WaitKind::kMbarrier && w.wait_mbar == m.off && parity_done(m, w.wait_parity)) {
      w.wait = WaitKind::kNone;
      woke = true;
    }
  }
  if (woke) land_bulk(b, m.unlanded);
}

// One arrival on barrier m of block `target` (the caller's, or another CTA's of its cluster).
void mbar_arrive_n(Fiber* f, Block& target, Mbar& m, std::source_location loc) {
  Block& b = *f->block;
  publish_generic(f);
  if (m.pending <= 0) {
    report(b, f, "mbarrier_arrive: more arrivals than the barrier's count (" + std::to_string(m.count) + ")", loc);
    return;
  }
  --m.pending;
  mbar_try_complete(target, m);
  // starve-last: a starved warp (the producer) hands the SM back after each arrive, so the consumers it releases run
  // before it produces the next buffer (a consumer that skipped that buffer's wait reads it unwritten)
  const int nwarps = (b.nthreads + 31) / 32;
  if (settings().schedule == Schedule::kStarveLast && f->tc.linear_tid / 32 >= nwarps - held_warps(nwarps))
    yield(f);
}

}  // namespace

void mbarrier_init(void* bar, int count, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  if (!check_smem(f, bar, 8, "mbarrier_init", loc)) return;
  const size_t off = static_cast<size_t>(static_cast<unsigned char*>(bar) - b.smem);
  if (off % 8 != 0 || count < 1 || count > (1 << 20) - 1) {
    report(b, f, "mbarrier_init: offset " + std::to_string(off) + " must be 8-byte aligned and count " +
                     std::to_string(count) + " in 1 .. 2^20 - 1", loc);
    return;
  }
  auto it = b.mbars.find(off);
  if (it != b.mbars.end() && (!it->second.copies.empty() || it->second.tx != 0)) {
    report(b, f, "mbarrier_init on a barrier whose phase still has bulk copies in flight", loc);
    return;
  }
  Mbar m;
  m.off = off;
  m.count = m.pending = count;
  m.init_loc = loc;
  m.init_tid = f->tc.linear_tid;
  m.init_syncs = b.syncs;
  b.mbars[off] = std::move(m);
  std::memset(bar, 0, 8);  // the object's bytes are the barrier's, not data
}

void mbarrier_arrive(void* bar, std::source_location loc) {
  Fiber* f = cur_fiber();
  if (Mbar* m = mbar_at(f, bar, "mbarrier_arrive", loc)) mbar_arrive_n(f, *f->block, *m, loc);
}

void mbarrier_arrive_expect_tx(void* bar, uint32_t bytes, std::source_location loc) {
  Fiber* f = cur_fiber();
  if (Mbar* m = mbar_at(f, bar, "mbarrier_arrive_expect_tx", loc)) {
    m->tx += bytes;
    mbar_arrive_n(f, *f->block, *m, loc);
  }
}

void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, void* bar, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  if (bytes == 0 || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(smem_dst) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(gmem_src) % 16 != 0) {
    report(b, f, "cp.async.bulk of " + std::to_string(bytes) + " bytes from " + hexaddr(gmem_src) + " to " +
                     hexaddr(smem_dst) + ": size must be a non-zero multiple of 16 and both addresses 16-byte aligned",
           loc);
    return;
  }
  Mbar* m = mbar_at(f, bar, "cp.async.bulk", loc);
  if (m == nullptr || !check_smem(f, smem_dst, bytes, "cp.async.bulk destination", loc)) return;
  check_async_proxy_write(f, b, static_cast<size_t>(static_cast<unsigned char*>(smem_dst) - b.smem), bytes,
                          "cp.async.bulk destination", loc);
  BulkCopy c;
  c.dst = static_cast<unsigned char*>(smem_dst);
  c.data.resize(bytes);
  if (check_global(f, gmem_src, bytes, "cp.async.bulk source", loc)) std::memcpy(c.data.data(), gmem_src, bytes);
  else std::memset(c.data.data(), 0xFF, bytes);
  if (settings().cp_async_at_issue) land_one(b, c);  // the earliest legal landing, as for cp.async
  else m->copies.push_back(std::move(c));
  m->tx -= bytes;
  mbar_try_complete(b, *m);
}

void cp_async_mbarrier_arrive_noinc(void* bar, std::source_location loc) {
  Fiber* f = cur_fiber();
  Mbar* m = mbar_at(f, bar, "cp_async_mbarrier_arrive_noinc", loc);
  if (m == nullptr) return;
  publish_generic(f);
  // the thread's cp.asyncs so far complete with the barrier's phase (their commit groups no longer matter); they
  // write shared memory as the bulk copies do (a wgmma may read them once the phase is waited for)
  auto tie = [&](std::vector<PendingCopy>& group) {
    for (const PendingCopy& c : group) {
      BulkCopy bc;
      bc.dst = c.dst;
      bc.data.assign(c.data, c.data + c.bytes);
      m->copies.push_back(std::move(bc));
    }
    group.clear();
  };
  for (auto& g : f->committed) tie(g);
  f->committed.clear();
  tie(f->open_group);
  // landing "issue": the copies already landed are tied the same way, so they count as the barrier's (async-proxy)
  // writes, as they do when they land with the phase in landing "wait": a wgmma may read them once a thread waited
  // on the phase, without a fence in the copying thread (which could not order a copy still in flight). The thread's
  // st_shared marks (word_writer) stay: a generic-proxy write still needs its fence_proxy_async before the arrive
  Block& blk = *f->block;
  for (const auto& [off, bytes] : f->landed_untied)
    for (size_t c = off / 16; c <= (off + bytes - 1) / 16 && c < blk.chunk_writer.size(); ++c)
      if (blk.chunk_writer[c] == f->tc.linear_tid + 1) blk.chunk_writer[c] = 0;
  f->landed_untied.clear();
  mbar_arrive_n(f, *f->block, *m, loc);
}

void mbarrier_wait(void* bar, unsigned parity, std::source_location loc) {
  Fiber* f = cur_fiber();
  if (skipped_by_fault(FaultKind::kSkipMbarrierWait, f->mbarrier_wait_calls)) return;
  Mbar* m = mbar_at(f, bar, "mbarrier_wait", loc);
  if (m == nullptr) return;
  Block& b = *f->block;
  if (!parity_done(*m, parity)) {
    f->wait = WaitKind::kMbarrier;
    f->wait_mbar = m->off;
    f->wait_parity = parity;
    f->wait_loc = loc;
    mbar_try_complete(b, *m);  // (a phase whose copies from another CTA complete only once a thread waits)
    yield(f);  // resumed by the arrival or copy that completes the phase (it landed the copies)
    return;
  }
  land_bulk(b, m->unlanded);
}

// ---- thread-block clusters (csrc/arch/cluster.cuh) --------------------------------------------------------------

namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// A shared::cluster address decoded: the CTA it names and the byte offset in that CTA's shared memory.
struct ClusterAddr {
  Block* block;
  int rank;
  size_t off;
};

// Decodes a shared::cluster address ((1 << 31) | (rank << 24) | offset, from map_shared_rank) for an access of
// `bytes` bytes by `what`; abandons the block after a report for an address that is not one, a rank outside the
// cluster, bytes outside the target CTA's dynamic shared memory, or a target CTA whose threads all exited.
ClusterAddr cluster_addr(Fiber* f, uint32_t a, size_t bytes, const char* what, std::source_location loc) {
  const Cluster& cl = *f->block->cluster;
  if ((a >> 31) == 0) {
    fatal(f, std::string(what) + ": " + hex32(a) + " is not a shared::cluster address (map_shared_rank gives "
                 "(1 << 31) | (rank << 24) | offset)", loc);
  }
  const int rank = static_cast<int>((a >> 24) & 0x7Fu);
  const size_t off = a & 0xFFFFFFu;
  if (rank >= cl.size) {
    fatal(f, std::string(what) + ": shared::cluster address " + hex32(a) + " names CTA rank " + std::to_string(rank) +
                 ", outside the cluster's " + std::to_string(cl.size) + " CTA(s)", loc);
  }
  Block& t = *cl.blocks[rank];
  if (off + bytes > t.smem_bytes) {
    fatal(f, std::string(what) + ": shared::cluster address " + hex32(a) + " (CTA rank " + std::to_string(rank) +
                 ", offset " + std::to_string(off) + ", +" + std::to_string(bytes) + " bytes) is outside the CTA's " +
                 std::to_string(t.smem_bytes) + " bytes of dynamic shared memory", loc);
  }
  if (t.live == 0) {
    fatal(f, std::string(what) + ": CTA rank " + std::to_string(rank) + " of the cluster has exited: its shared memory "
                 "is gone (a cluster_sync before exit?)", loc);
  }
  return {&t, rank, off};
}

// The mbarrier at a decoded shared::cluster address (visible_mbar's checks); abandons the block after a report.
Mbar& cluster_mbar(Fiber* f, const ClusterAddr& a, const char* what, std::source_location loc) {
  Mbar* m = visible_mbar(f, *a.block, a.off, what, loc);
  if (m == nullptr) abandon(f);
  return *m;
}

}  // namespace

int cluster_ctarank() { return cur_fiber()->block->rank; }

void cluster_sync(std::source_location loc) {
  Fiber* f = cur_fiber();
  Cluster& cl = *f->block->cluster;
  publish_generic(f);  // a release, as block_sync
  if (++cl.sync_arrived == cl.nthreads) {
    cl.sync_arrived = 0;
    ++cl.syncs;
    for (Block* b : cl.blocks) {
      ++b->syncs;  // a block barrier too: mbarrier inits before it are visible to the CTA's other threads
      for (int t = 0; t < b->nthreads; ++t)
        if (b->fibers[t].wait == WaitKind::kCluster) b->fibers[t].wait = WaitKind::kNone;
    }
    return;
  }
  f->wait = WaitKind::kCluster;
  f->wait_loc = loc;
  yield(f);
}

void fence_mbarrier_init_cluster(std::source_location) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  for (auto& [off, m] : b.mbars)
    if (m.init_tid == f->tc.linear_tid && m.cluster_fence < 0) m.cluster_fence = b.cluster->syncs;
}

uint32_t map_shared_rank(const void* p, int rank, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  if (!check_smem(f, p, 1, "map_shared_rank", loc)) abandon(f);
  if (rank < 0 || rank >= b.cluster->size) {
    fatal(f, "map_shared_rank: rank " + std::to_string(rank) + " is outside the cluster's " +
                 std::to_string(b.cluster->size) + " CTA(s) (ranks 0.." + std::to_string(b.cluster->size - 1) + ")",
          loc);
  }
  const auto off = static_cast<uint32_t>(static_cast<const unsigned char*>(p) - b.smem);
  return (1u << 31) | (static_cast<uint32_t>(rank) << 24) | off;
}

void mbarrier_arrive_cluster(uint32_t bar, std::source_location loc) {
  Fiber* f = cur_fiber();
  const ClusterAddr a = cluster_addr(f, bar, 8, "mbarrier_arrive_cluster", loc);
  Mbar& m = cluster_mbar(f, a, "mbarrier_arrive_cluster", loc);
  mbar_arrive_n(f, *a.block, m, loc);  // completing the phase wakes the target CTA's waiting threads
}

void bulk_copy_s2cluster(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, std::source_location loc) {
  Fiber* f = cur_fiber();
  Block& b = *f->block;
  const auto* s = static_cast<const unsigned char*>(src);
  if (bytes == 0 || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 || dst % 16 != 0) {
    fatal(f, "cp.async.bulk.shared::cluster of " + std::to_string(bytes) + " bytes from " + hexaddr(src) + " to " +
                 hex32(dst) + ": size must be a non-zero multiple of 16 and both addresses 16-byte aligned", loc);
  }
  if (!check_smem(f, src, bytes, "cp.async.bulk.shared::cluster source", loc)) abandon(f);
  const ClusterAddr d = cluster_addr(f, dst, bytes, "cp.async.bulk.shared::cluster destination", loc);
  const ClusterAddr mb = cluster_addr(f, bar, 8, "cp.async.bulk.shared::cluster mbarrier", loc);
  if (d.rank != mb.rank) {
    fatal(f, "cp.async.bulk.shared::cluster: the destination is in CTA rank " + std::to_string(d.rank) +
                 ", the mbarrier in CTA rank " + std::to_string(mb.rank) + " (they must be in the same CTA)", loc);
  }
  Mbar& m = cluster_mbar(f, mb, "cp.async.bulk.shared::cluster", loc);
  // the source is read through the async proxy: this CTA's generic-proxy writes need their fence_proxy_async
  const size_t soff = static_cast<size_t>(s - b.smem);
  for (size_t off = soff; off < soff + bytes; off += 16)
    check_async_proxy_read(f, off, "cp.async.bulk.shared::cluster source", "the bulk copy's", loc);
  check_async_proxy_write(f, *d.block, d.off, bytes, "cp.async.bulk.shared::cluster destination", loc);
  BulkCopy c;
  c.dst = d.block->smem + d.off;
  c.data.assign(s, s + bytes);  // read at issue
  Block& t = *d.block;
  if (&t != &b) m.sources.push_back({&b, soff, c.data, loc});  // ... and checked unchanged at the phase's completion
  if (settings().cp_async_at_issue) {
    land_one(t, c);  // the earliest legal landing, as for bulk_copy_g2s
    m.tx -= bytes;
  } else if (&t != &b) {
    m.deferred.push_back(std::move(c));  // completes (and lands) at the latest legal moment: mbar_try_complete
  } else {
    m.copies.push_back(std::move(c));  // lands when a thread of the CTA first waits on the completed phase
    m.tx -= bytes;
  }
  mbar_try_complete(t, m);
}

// ---------------------------------------------------------------------------
// host controls

void register_global(const void* p, size_t bytes, const char* name) {
  const auto lo = reinterpret_cast<uintptr_t>(p);
  settings().globals.push_back({lo, lo + bytes, name ? name : "?"});
}

void clear_globals() { settings().globals.clear(); }

void set_fault(const char* what, int nth) {
  const std::string w = what ? what : "";
  Settings& s = settings();
  if (w == "skip_block_sync") s.fault = FaultKind::kSkipBlockSync;
  else if (w == "skip_cp_async_wait") s.fault = FaultKind::kSkipCpAsyncWait;
  else if (w == "skip_wgmma_wait") s.fault = FaultKind::kSkipWgmmaWait;
  else if (w == "skip_fence_proxy_async") s.fault = FaultKind::kSkipFenceProxyAsync;
  else if (w == "skip_mbarrier_wait") s.fault = FaultKind::kSkipMbarrierWait;
  else if (w == "named_barrier_miscount") s.fault = FaultKind::kNamedBarrierMiscount;
  else if (w == "skip_named_barrier") s.fault = FaultKind::kSkipNamedBarrier;
  else if (w == "none" || w.empty()) s.fault = FaultKind::kNone;
  else throw std::invalid_argument("va::emu::set_fault: unknown fault '" + w +
                                   "' (known: skip_block_sync, skip_cp_async_wait, skip_wgmma_wait, "
                                   "skip_fence_proxy_async, skip_mbarrier_wait, named_barrier_miscount, skip_named_barrier, none)");
  s.fault_nth = nth;
  s.fault_tid_lo = 0;
  s.fault_tid_hi = kMaxThreadsPerBlock;
  g_fault_hits = 0;
}

void set_fault_threads(int lo, int hi) {
  if (lo < 0 || hi <= lo) throw std::invalid_argument("va::emu::set_fault_threads: need 0 <= lo < hi");
  settings().fault_tid_lo = lo;
  settings().fault_tid_hi = hi;
}

void clear_faults() { set_fault("none", -1); }
long long fault_hits() { return g_fault_hits.load(); }

void set_schedule(const char* name, uint64_t seed) {
  const std::string n = name ? name : "";
  Settings& s = settings();
  if (!schedule_named(n, s.schedule)) {
    std::string known;
    for (const char* k : kScheduleNames) known += (known.empty() ? "" : ", ") + std::string(k);
    throw std::invalid_argument("va::emu::set_schedule: unknown schedule '" + n + "' (known: " + known + ")");
  }
  s.seed = seed;
}

void set_cp_async_landing(const char* when) {
  const std::string w = when ? when : "";
  if (w == "wait") settings().cp_async_at_issue = false;
  else if (w == "issue") settings().cp_async_at_issue = true;
  else throw std::invalid_argument("va::emu::set_cp_async_landing: '" + w + "' (known: wait, issue)");
}

void set_num_workers(int n) {
  if (n < 0) throw std::invalid_argument("va::emu::set_num_workers: n must be >= 0");
  settings().workers = n;
}

void set_smem_limit(size_t bytes) { settings().smem_limit = bytes; }

Stats stats() {
  std::lock_guard<std::mutex> lk(g_stats_mu);
  return g_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> lk(g_stats_mu);
  g_stats = Stats{};
}

std::string describe_settings() {
  const Settings& s = settings();
  static const char* kFault[] = {"none", "skip_block_sync", "skip_cp_async_wait", "skip_wgmma_wait",
                                 "skip_fence_proxy_async", "skip_mbarrier_wait", "named_barrier_miscount",
                                 "skip_named_barrier"};
  return std::string("schedule=") + kScheduleNames[static_cast<int>(s.schedule)] + " seed=" + std::to_string(s.seed) +
         " workers=" + std::to_string(s.workers) + " smem_limit=" + std::to_string(s.smem_limit) +
         " cp_async=" + (s.cp_async_at_issue ? "issue" : "wait") + " fault=" + kFault[static_cast<int>(s.fault)] + " nth=" + std::to_string(s.fault_nth) +
         " globals=" + std::to_string(s.globals.size());
}

// ---------------------------------------------------------------------------
// launcher

void run_grid(dim3 grid, dim3 block, size_t dyn_smem_bytes, const std::function<void()>& body) {
  run_grid(grid, block, dyn_smem_bytes, body, dim3(1, 1, 1));
}

void run_grid(dim3 grid, dim3 block, size_t dyn_smem_bytes, const std::function<void()>& body, dim3 cluster,
              bool dependent) {
  const long long nthreads = static_cast<long long>(block.x) * block.y * block.z;
  if (nthreads < 1 || nthreads > kMaxThreadsPerBlock) {
    throw std::runtime_error("va::emu::run_grid: block of " + std::to_string(block.x) + "x" +
                             std::to_string(block.y) + "x" + std::to_string(block.z) +
                             " threads; CUDA allows 1 to 1024");
  }
  if (dyn_smem_bytes > settings().smem_limit) {
    throw std::runtime_error("va::emu::run_grid: " + std::to_string(dyn_smem_bytes) +
                             " bytes of dynamic shared memory exceed the limit of " +
                             std::to_string(settings().smem_limit));
  }
  const long long nblocks = static_cast<long long>(grid.x) * grid.y * grid.z;
  if (nblocks == 0) return;
  const long long csize = static_cast<long long>(cluster.x) * cluster.y * cluster.z;
  if (csize < 1 || csize > 8 || grid.x % cluster.x != 0 || grid.y % cluster.y != 0 || grid.z % cluster.z != 0) {
    throw std::runtime_error("va::emu::run_grid: cluster " + std::to_string(cluster.x) + "x" +
                             std::to_string(cluster.y) + "x" + std::to_string(cluster.z) + " must divide the grid " +
                             std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
                             " and hold 1 to 8 CTAs");
  }
  const long long nclusters = nblocks / csize;

  std::lock_guard<std::mutex> launch_lock(g_launch_mu);
  LaunchState st;
  st.body = &body;
  st.grid = grid;
  st.block = block;
  st.smem_bytes = dyn_smem_bytes;
  st.cluster = cluster;
  st.dependent = dependent;
  g_launch = &st;

  int nworkers = settings().workers > 0 ? settings().workers
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nworkers = static_cast<int>(std::min<long long>(nworkers, nclusters));
  std::atomic<long long> next{0};
  std::vector<Worker> workers(nworkers);
  auto work = [&](Worker& w) {
    install_crash_handler();
    try {
      while (!st.stop) {
        const long long i = next.fetch_add(1);  // workers pick whole clusters
        if (i >= nclusters) break;
        w.run_cluster(i, st);
      }
    } catch (const std::exception& e) {
      st.error_count.fetch_add(1);
      st.stop = true;
      std::lock_guard<std::mutex> lk(st.mu);
      st.errors.push_back(std::string("emulator failure: ") + e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < nworkers; ++i) threads.emplace_back(work, std::ref(workers[i]));
  work(workers[0]);
  for (std::thread& t : threads) t.join();
  g_launch = nullptr;
  std::sort(st.written.begin(), st.written.end());  // merged: the next launch's dependency checks search it
  g_prev_written.clear();
  for (const auto& r : st.written) {
    if (!g_prev_written.empty() && r.first <= g_prev_written.back().second)
      g_prev_written.back().second = std::max(g_prev_written.back().second, r.second);
    else
      g_prev_written.push_back(r);
  }

  {
    std::lock_guard<std::mutex> lk(g_stats_mu);
    g_stats.launches += 1;
    g_stats.max_dyn_smem = std::max(g_stats.max_dyn_smem, static_cast<long long>(dyn_smem_bytes));
    for (const Worker& w : workers) w.merge_stats(g_stats);
  }
  if (st.error_count > 0) {
    std::string msg = "emulated launch (grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                      std::to_string(grid.z) + ", block " + std::to_string(block.x) + "x" +
                      std::to_string(block.y) + "x" + std::to_string(block.z) +
                      (csize > 1 ? ", cluster " + std::to_string(cluster.x) + "x" + std::to_string(cluster.y) + "x" +
                                       std::to_string(cluster.z)
                                 : std::string()) +
                      ", smem " +
                      std::to_string(dyn_smem_bytes) + " B) found " + std::to_string(st.error_count.load()) +
                      " error(s):";
    for (const std::string& e : st.errors) msg += "\n  " + e;
    if (st.error_count > static_cast<long long>(st.errors.size())) msg += "\n  ...";
    throw std::runtime_error(msg);
  }
}

}  // namespace va::emu
