// Shared by the emulator's extern "C" entry points and the device-API test kernels:
// run a callable and turn a C++ exception into a message a ctypes caller can read.
#pragma once

#include <cstdio>
#include <exception>

namespace va::emu {

// nullptr on success, else the exception's message (valid until the next failure on this thread).
template <class F>
const char* guarded(F&& f) {
  thread_local char err[8192];
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    std::snprintf(err, sizeof(err), "%s", e.what());
    return err;
  }
}

}  // namespace va::emu
