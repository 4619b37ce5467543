#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
// void va_emu_switch(void** save_sp, void* load_sp)   (System V x86-64 ABI)
// Pushes the callee-saved registers and the floating-point control state on
// the current stack, stores rsp, loads the other stack and pops its state.
// va_emu_fiber_start is where a fresh fiber's first "ret" lands: r12 holds
// the argument and r13 the entry function (placed there by make_context).
asm(R"(
  .text
  .p2align 4
  .globl va_emu_switch
  .hidden va_emu_switch
  .type va_emu_switch,@function
va_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size va_emu_switch, .-va_emu_switch

  .p2align 4
  .globl va_emu_fiber_start
  .hidden va_emu_fiber_start
  .type va_emu_fiber_start,@function
va_emu_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size va_emu_fiber_start, .-va_emu_fiber_start
)");

extern "C" void va_emu_switch(void** save_sp, void* load_sp);
extern "C" void va_emu_fiber_start();
#endif

namespace va::emu {

#if defined(__x86_64__)
void make_context(Context& ctx, void* stack, size_t size, FiberEntry entry, void* arg) {
  // Top of stack, 16-byte aligned; the initial frame is popped by va_emu_switch:
  // [fp control][r15][r14][r13][r12][rbx][rbp][ret -> va_emu_fiber_start].
  // After the 8 pops/ret rsp = sp + 64 must be 16-byte aligned so that the
  // call in va_emu_fiber_start enters entry() with the ABI's alignment.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 64 - 16);
  uint32_t mxcsr;
  uint16_t fcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fcw));
  sp[0] = static_cast<uint64_t>(mxcsr) | (static_cast<uint64_t>(fcw) << 32);
  sp[1] = 0;                                           // r15
  sp[2] = 0;                                           // r14
  sp[3] = reinterpret_cast<uint64_t>(entry);           // r13
  sp[4] = reinterpret_cast<uint64_t>(arg);             // r12
  sp[5] = 0;                                           // rbx
  sp[6] = 0;                                           // rbp
  sp[7] = reinterpret_cast<uint64_t>(&va_emu_fiber_start);  // return address
  ctx.sp = sp;
}

void switch_context(Context& from, Context& to) { va_emu_switch(&from.sp, to.sp); }
#else
namespace {
struct Trampoline {
  FiberEntry entry;
  void* arg;
};
thread_local Trampoline g_tramp;
void tramp_start() { g_tramp.entry(g_tramp.arg); }
}  // namespace

void make_context(Context& ctx, void* stack, size_t size, FiberEntry entry, void* arg) {
  // ucontext passes int arguments only; the entry and its argument travel in a
  // thread-local slot that is read before the first switch returns.
  if (getcontext(&ctx.uc) != 0) throw std::runtime_error("emu: getcontext failed");
  ctx.uc.uc_stack.ss_sp = stack;
  ctx.uc.uc_stack.ss_size = size;
  ctx.uc.uc_link = nullptr;
  g_tramp = {entry, arg};
  makecontext(&ctx.uc, tramp_start, 0);
}

void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

Stack::Stack(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_ = (bytes + page - 1) / page * page;
  map_size_ = size_ + page;
  map_ = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
              -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw std::runtime_error("emu: cannot map a fiber stack of " + std::to_string(map_size_) + " bytes");
  }
  mprotect(map_, page, PROT_NONE);  // guard page below the stack (stacks grow down)
  base_ = static_cast<char*>(map_) + page;
}

Stack::~Stack() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

}  // namespace va::emu
