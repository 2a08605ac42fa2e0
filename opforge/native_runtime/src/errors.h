// Errors inside the runtime: C++ exceptions that never cross the C API. Every C entry
// point runs its body through guarded() (runtime.cpp), which turns an Error (or a
// ProgramError from the reader, or std::bad_alloc) into a status and the thread's last
// message. Messages follow opforge's form: api — subject — found — valid — fix.
#pragma once

#include <string>

#include "opforge/runtime.h"

namespace opforge::rt {

struct Error {
  opf_status status;
  std::string message;
};

[[noreturn]] inline void raise(opf_status status, std::string message) {
  throw Error{status, std::move(message)};
}

// The calling thread's last message (opf_last_error), set by guarded() on failure.
void set_last_error(const std::string& message);
void clear_last_error();
const char* last_error_text();

}  // namespace opforge::rt
