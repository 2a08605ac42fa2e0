// Version and error reporting of the C API.
#include "errors.h"

namespace opforge::rt {
namespace {
thread_local std::string last_error;
}

void set_last_error(const std::string& message) { last_error = message; }
void clear_last_error() { last_error.clear(); }
const char* last_error_text() { return last_error.c_str(); }

}  // namespace opforge::rt

extern "C" {

OPF_API uint32_t opf_api_version(void) { return OPF_RUNTIME_API_VERSION; }

OPF_API const char* opf_version_string(void) { return "opforge-runtime 0.1.0"; }

OPF_API const char* opf_last_error(void) { return opforge::rt::last_error_text(); }

OPF_API const char* opf_status_name(opf_status status) {
  switch (status) {
    case OPF_OK: return "OPF_OK";
    case OPF_ERR_INVALID_ARGUMENT: return "OPF_ERR_INVALID_ARGUMENT";
    case OPF_ERR_IO: return "OPF_ERR_IO";
    case OPF_ERR_PROGRAM: return "OPF_ERR_PROGRAM";
    case OPF_ERR_MISSING_KERNEL: return "OPF_ERR_MISSING_KERNEL";
    case OPF_ERR_LIBRARY: return "OPF_ERR_LIBRARY";
    case OPF_ERR_INPUT: return "OPF_ERR_INPUT";
    case OPF_ERR_KERNEL: return "OPF_ERR_KERNEL";
    case OPF_ERR_MEMORY: return "OPF_ERR_MEMORY";
    case OPF_ERR_BUSY: return "OPF_ERR_BUSY";
    case OPF_ERR_UNSUPPORTED: return "OPF_ERR_UNSUPPORTED";
    case OPF_ERR_STATE: return "OPF_ERR_STATE";
    case OPF_ERR_INTERNAL: return "OPF_ERR_INTERNAL";
    default: return "OPF_ERR_UNKNOWN";
  }
}

OPF_API int64_t opf_dtype_itemsize(int32_t dtype) {
  switch (dtype) {
    case 0: case 1: case 11: return 1;           // uint8, int8, bool
    case 2: case 5: case 15: case 27: return 2;  // int16, float16, bfloat16, uint16
    case 3: case 6: case 8: case 28: return 4;   // int32, float32, complex32, uint32
    case 4: case 7: case 9: case 29: return 8;   // int64, float64, complex64, uint64
    case 10: return 16;                          // complex128
    default: return 0;
  }
}

}  // extern "C"
