// Data-dependent sizes: symbols an instruction produces at run time (nonzero's rows,
// item() used as a size). Mirrors opforge/program/produced.py, whose docstring gives the
// rules: a symbol no input dimension determines is bound by the first KernelCall argument
// sized exactly by it (from that tensor's size after the call) or by a Move of a
// one-element integer tensor into an Int sized by it (from the element's value).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/kernel_abi.h"
#include "program.h"

namespace opforge::rt {

struct Producer {
  int symbol = -1;           // index into Method::symbols
  uint32_t instruction = 0;  // bound after this instruction runs
  uint32_t value = 0;        // the tensor it is read from
  int dim = -1;              // that tensor's dimension; -1: its one element (a Move)
};

// How each symbol with !bound_by_inputs[s] is produced, in instruction order. Throws
// ProgramError (messages as produced.py's, under `where`) when one is produced by no
// instruction, read before it is produced, sizes an input, or grows.
std::vector<Producer> find_producers(const Method& m, const std::vector<bool>& bound_by_inputs,
                                     const std::string& where);

// The bound call of a producing Move (item() as a size): nothing to copy, the method
// reads the element after it (MethodInstance::run_producing).
void read_size_kernel(opforge_context* ctx, opforge_arg* args, int64_t num_args);

}  // namespace opforge::rt
