// Node names for messages: which FX node each instruction of a method computes, from the
// program's debug table (user metadata "opforge.debug", opforge/program/debug.py; the
// verifier has checked it). An instruction's node is the node of its first capture.
#pragma once

#include <string>
#include <vector>

#include "program.h"

namespace opforge::rt {

// One name per instruction of `method` ("" where the table says nothing, or without a table).
std::vector<std::string> instruction_nodes(const Program& program, const Method& method);

}  // namespace opforge::rt
