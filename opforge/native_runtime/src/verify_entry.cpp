// opf_program_verify: read and verify a program held in memory, without loading it.
#include <new>

#include "errors.h"
#include "memory.h"
#include "opforge/runtime.h"
#include "program.h"

extern "C" OPF_API opf_status opf_program_verify(const void* data, size_t size) {
  using namespace opforge::rt;
  if (data == nullptr && size != 0) {
    set_last_error("opf_program_verify — data — found NULL with size " + std::to_string(size) +
                   " — valid: a pointer to size bytes — fix: pass the file's bytes");
    return OPF_ERR_INVALID_ARGUMENT;
  }
  try {
    static const uint8_t kEmpty = 0;
    // the decoded tables are held to the default memory limit, as a load's are
    int64_t limit = kDefaultMaxMemory;
    try {
      limit = resolve_max_memory(0, "opf_program_verify");
    } catch (const Error&) {
      // a malformed OPFORGE_MAX_MEMORY: the default (loading reports it)
    }
    read_program(data ? static_cast<const uint8_t*>(data) : &kEmpty, size, limit);
    clear_last_error();
    return OPF_OK;
  } catch (const ProgramError& e) {
    set_last_error(e.message);
    return OPF_ERR_PROGRAM;
  } catch (const std::bad_alloc&) {
    set_last_error("opf_program_verify — memory — found an allocation that failed while "
                   "reading the program — valid: a program that fits in memory — fix: free "
                   "memory or check the file");
    return OPF_ERR_PROGRAM;
  } catch (...) {
    set_last_error("opf_program_verify — internal error — found an unexpected exception — "
                   "valid: none — fix: report this as a bug");
    return OPF_ERR_INTERNAL;
  }
}
