// Minimal cooperative fibers for the emulator: a hand-rolled x86-64 context
// switch (callee-saved registers, MXCSR and the x87 control word, then the
// stack pointer), about a nanosecond-scale call with no system call, where
// glibc's swapcontext makes a sigprocmask system call per switch (FACTS.md:
// ~0.4 us). Other architectures fall back to ucontext.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace va::emu {

// An execution context: a fiber's or the scheduler's.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;  // saved stack pointer
#else
  ucontext_t uc;
#endif
};

using FiberEntry = void (*)(void* arg);

// Prepares ctx to start entry(arg) on [stack, stack + size) at the first
// switch into it. entry must never return (it switches away for good).
void make_context(Context& ctx, void* stack, size_t size, FiberEntry entry, void* arg);
// Saves the running context into from and resumes to.
void switch_context(Context& from, Context& to);

// A stack with a PROT_NONE guard page below it (an overflow faults instead of
// silently corrupting the neighbouring fiber).
class Stack {
 public:
  explicit Stack(size_t bytes);
  ~Stack();
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  void* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  size_t map_size_ = 0;
  void* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace va::emu
