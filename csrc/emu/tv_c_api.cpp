// C interface of an emulation build of the tree-verify kernels: the torch
// binding (csrc/bindings/emu_binding.cpp) and ctypes callers reach va::tv
// through these, so the kernels build without torch headers and a kernel edit
// never recompiles the binding.
#include <stdexcept>
#include <string>

#include "tree_verify/api.h"

#define VA_EMU_C_API extern "C" __attribute__((visibility("default")))

namespace {
thread_local std::string g_msg;
}

// nullptr on success; else "V<message>" for std::invalid_argument (an
// unsupported combination or bad parameter) or "R<message>" for any other error
// (the emulator's findings: bounds, barriers, collectives).
VA_EMU_C_API const char* va_emu_tv_run(const va::tv::Params* p, const va::tv::LaunchConfig* cfg) {
  try {
    va::tv::run(*p, *cfg, nullptr);
    return nullptr;
  } catch (const std::invalid_argument& e) {
    g_msg = std::string("V") + e.what();
  } catch (const std::exception& e) {
    g_msg = std::string("R") + e.what();
  } catch (...) {
    g_msg = "Runknown exception";
  }
  return g_msg.c_str();
}

VA_EMU_C_API size_t va_emu_tv_workspace_bytes(const va::tv::Params* p, const va::tv::LaunchConfig* cfg) {
  return va::tv::workspace_bytes(*p, *cfg);
}

// The names of the linked instantiations, one per line.
VA_EMU_C_API const char* va_emu_tv_built_kernels() {
  g_msg.clear();
  for (const std::string& s : va::tv::built_kernels()) g_msg += s + "\n";
  return g_msg.c_str();
}

// sizeof(Params) and sizeof(LaunchConfig), so a binding built against other
// headers is refused instead of misreading the struct.
VA_EMU_C_API size_t va_emu_tv_params_size() { return sizeof(va::tv::Params); }
VA_EMU_C_API size_t va_emu_tv_config_size() { return sizeof(va::tv::LaunchConfig); }
