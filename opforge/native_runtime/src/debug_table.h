// The debug table (user metadata "opforge.debug"): checked exactly as
// opforge/program/debug.py's check_debug_table does, indices against the program.
#pragma once

#include <string>

#include "program.h"

namespace opforge::rt {

constexpr const char* kDebugKey = "opforge.debug";

// ProgramError for a malformed table or an index out of range; builds nothing.
void check_debug_table(const Program& program, const std::string& text);

}  // namespace opforge::rt
