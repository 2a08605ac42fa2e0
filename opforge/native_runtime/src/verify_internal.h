// Shared between verify.cpp and verify_symbolic.cpp (not part of the runtime's API).
#pragma once

#include <string>
#include <vector>

#include "program.h"
#include "symbolic.h"

namespace opforge::rt {

// A method's size expressions, parsed (symbolic_values[i].exprs[d], guards[i] lhs/rhs).
// An expression reading an undeclared symbol is kept with that name (refused, naming its
// entry, by verify_symbolic before anything bounds it).
struct ParsedExpr {
  SizeExpr expr;
  std::string unknown;  // the first undeclared symbol it reads, or ""
};
struct ParsedSymbolic {
  std::vector<std::vector<ParsedExpr>> values;
  std::vector<ParsedExpr> lhs, rhs;
};

// Parses every expression of `m` against its symbols; ProgramError naming the entry.
ParsedSymbolic parse_symbolic(const Method& m, const std::string& where);

// Per value: whether it is a growing tensor (growing_values in symbolic.py): a symbolic
// TensorValue without storage whose expressions read a growing symbol.
std::vector<bool> growing_values(const Method& m, const ParsedSymbolic& parsed);

// Bytes in its arena or segment: ceil(numel / 2) int4-packed, one element for a splat.
int64_t stored_nbytes(const TensorDef& t);

void verify_symbolic(const Method& m, const ParsedSymbolic& parsed, const std::string& where);
void verify_shared_state(const Program& p);

}  // namespace opforge::rt
