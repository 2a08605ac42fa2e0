// What both tools open: the kernel registry (the portable kernels plus --kernels
// libraries) and a program, with the C API's errors turned into a message and an exit
// status. Header-only: each tools/*.cpp is one executable.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "opforge/runtime.h"

namespace opforge::tools {

constexpr int kExitError = 1;  // the runtime refused something (its message is printed)
constexpr int kExitUsage = 2;  // the command line is wrong

[[noreturn]] inline void fail(const char* tool, const std::string& message, int code = kExitError) {
  std::fprintf(stderr, "%s: %s\n", tool, message.c_str());
  std::exit(code);
}

// Exit with opf_last_error() unless status is OPF_OK.
inline void check(const char* tool, opf_status status, const std::string& doing) {
  if (status == OPF_OK) return;
  const char* message = opf_last_error();
  fail(tool, doing + " failed (" + opf_status_name(status) + "): " +
                 (message && *message ? message : "(no message)"));
}

inline const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case 0: return "uint8";
    case 1: return "int8";
    case 2: return "int16";
    case 3: return "int32";
    case 4: return "int64";
    case 5: return "float16";
    case 6: return "float32";
    case 7: return "float64";
    case 8: return "complex32";
    case 9: return "complex64";
    case 10: return "complex128";
    case 11: return "bool";
    case 15: return "bfloat16";
    case 27: return "uint16";
    case 28: return "uint32";
    case 29: return "uint64";
    default: return "dtype?";
  }
}

inline std::string shape_text(const int64_t* sizes, int64_t rank) {
  std::string text = "(";
  for (int64_t i = 0; i < rank; ++i) {
    text += std::to_string(sizes[i]);
    if (rank == 1 || i + 1 < rank) text += ",";
    if (i + 1 < rank) text += " ";
  }
  return text + ")";
}

// An input or output as the program declares it: "float32 of shape (2, 4)" or with
// bounds "int64 of shape (seq,) with dim 0 in [1, 48]".
inline std::string describe_io(const opf_io_info& info) {
  switch (info.kind) {
    case OPF_VALUE_INT: return "an int";
    case OPF_VALUE_DOUBLE: return "a double";
    case OPF_VALUE_BOOL: return "a bool";
    default: break;
  }
  std::string text = std::string(dtype_name(info.dtype)) + " of shape " +
                     shape_text(info.sizes, info.rank);
  for (int32_t d = 0; d < info.rank; ++d) {
    if (info.min_sizes && info.max_sizes && info.min_sizes[d] != info.max_sizes[d]) {
      text += " with dim " + std::to_string(d) + " in [" + std::to_string(info.min_sizes[d]) +
              ", " + (info.max_sizes[d] == INT64_MAX ? std::string("unbounded")
                                                      : std::to_string(info.max_sizes[d])) + "]";
    }
  }
  return text;
}

// Element i of a dense tensor as a double (float16 and bfloat16 widened exactly); NaN for
// the complex types, which have no single value.
inline double element_as_double(int32_t dtype, const void* data, int64_t i) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case 0: return p[i];
    case 1: return (double)(int8_t)p[i];
    case 11: return p[i] != 0;
    case 2: { int16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case 27: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case 3: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case 28: { uint32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case 4: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return (double)v; }
    case 29: { uint64_t v; std::memcpy(&v, p + 8 * i, 8); return (double)v; }
    case 6: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case 7: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case 15: {  // bfloat16: the high half of a float32
      uint16_t h; std::memcpy(&h, p + 2 * i, 2);
      uint32_t bits = (uint32_t)h << 16; float v; std::memcpy(&v, &bits, 4); return v;
    }
    case 5: {  // float16 (IEEE binary16)
      uint16_t h; std::memcpy(&h, p + 2 * i, 2);
      int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
      double v = exponent == 0 ? std::ldexp((double)mantissa, -24)
                 : exponent == 31 ? (mantissa ? NAN : INFINITY)
                 : std::ldexp((double)(mantissa | 0x400), exponent - 25);
      return sign ? -v : v;
    }
    default: return NAN;
  }
}

// The registry and the loaded program, freed in order.
class Session {
 public:
  Session(const char* tool, const std::string& path, const std::vector<std::string>& kernels)
      : tool_(tool) {
    if (opf_api_version() != OPF_RUNTIME_API_VERSION)
      fail(tool, "opf_api_version() — the library is version " +
                     std::to_string(opf_api_version()) + " — valid: " +
                     std::to_string(OPF_RUNTIME_API_VERSION) + " — fix: rebuild the tool");
    check(tool, opf_registry_new(&registry_), "opf_registry_new");
    for (const std::string& library : kernels)
      check(tool, opf_registry_load_library(registry_, library.c_str(), 0),
            "loading kernel library '" + library + "'");
    check(tool, opf_program_load_path(path.c_str(), registry_, nullptr, &program_),
          "loading '" + path + "'");
  }
  ~Session() {
    opf_program_free(program_);
    opf_registry_free(registry_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  opf_program* program() const { return program_; }

  std::vector<std::string> method_names() const {
    std::vector<std::string> names;
    for (int64_t i = 0; i < opf_program_num_methods(program_); ++i)
      names.emplace_back(opf_program_method_name(program_, i));
    return names;
  }

  bool has_method(const std::string& name) const {
    for (const std::string& n : method_names())
      if (n == name) return true;
    return false;
  }

  // (inputs, outputs) of a method
  std::vector<opf_io_info> io(const std::string& method, bool inputs) const {
    int64_t n_in = 0, n_out = 0;
    check(tool_, opf_program_method_io(program_, method.c_str(), &n_in, &n_out),
          "reading method '" + method + "'");
    std::vector<opf_io_info> infos((size_t)(inputs ? n_in : n_out));
    for (size_t i = 0; i < infos.size(); ++i)
      check(tool_, (inputs ? opf_program_input_info : opf_program_output_info)(
                       program_, method.c_str(), (int64_t)i, &infos[i]),
            "reading method '" + method + "'");
    return infos;
  }

 private:
  const char* tool_;
  opf_registry* registry_ = nullptr;
  opf_program* program_ = nullptr;
};

// A strictly parsed integer / float option value ("--repeat 3"); exits with a usage error.
inline int64_t parse_int(const char* tool, const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    fail(tool, option + " — found '" + text + "' — valid: an integer", kExitUsage);
  return value;
}

inline double parse_double(const char* tool, const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    fail(tool, option + " — found '" + text + "' — valid: a number", kExitUsage);
  return value;
}

}  // namespace opforge::tools
