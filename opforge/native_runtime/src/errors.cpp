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

}  // extern "C"
