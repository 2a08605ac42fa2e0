// Size expressions of a method's symbolic sizes (docs/program-format.md, "Symbolic"):
// parsed from their printed text into a flat node array, evaluated with checked int64
// arithmetic, bounded by interval arithmetic. Mirrors opforge/program/symbolic.py.
//
// Every walk over an expression recurses at most kMaxExprDepth (16) levels: the parser
// refuses anything deeper, so a hostile file cannot exhaust the stack.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "program.h"

namespace opforge::rt {

constexpr int kMaxExprNodes = 64;
constexpr int kMaxExprDepth = 16;
constexpr size_t kMaxExprText = 1024;
constexpr int kMaxSymbols = 64;

enum class ExprOp : uint8_t { Int, Sym, Add, Sub, Mul, FloorDiv, Mod, Min, Max };

struct ExprNode {
  ExprOp op = ExprOp::Int;
  int64_t value = 0;    // Int: the constant; Sym: the symbol's index
  int16_t lhs = -1;     // operators: node indices of the two arguments
  int16_t rhs = -1;
};

// The nodes in post-order: every argument precedes its operator; the root is last.
struct SizeExpr {
  std::vector<ExprNode> nodes;
  int root() const { return static_cast<int>(nodes.size()) - 1; }
  bool is_const() const { return nodes.size() == 1 && nodes[0].op == ExprOp::Int; }
  // Whether the expression reads symbol `s`.
  bool reads(int s) const;
  // Whether it reads any symbol at all.
  bool is_symbolic() const;
};

// Parse the printed grammar exactly (str(SizeExpr.parse(s)) == s): integers in decimal,
// symbols by name, (a + b), (a - b), (a * b), floordiv/mod/min/max(a, b); at most 1024
// characters, 64 nodes, depth 16. Symbols resolve to indices into `symbols`. Throws
// ProgramError naming `where` on any other spelling or an unknown symbol.
SizeExpr parse_size_expr(const std::string& text, const std::vector<Symbol>& symbols,
                         const std::string& where);
// The same, except that an unknown symbol is not an error: its name goes to *unknown (the
// first one) and its node reads symbol -1. The caller must refuse such an expression before
// it evaluates or bounds it (the verifier does, naming the entry as Python does).
SizeExpr parse_size_expr(const std::string& text, const std::vector<Symbol>& symbols,
                         const std::string& where, std::string* unknown);

// The printed form (what parse_size_expr reads back).
std::string to_string(const SizeExpr& e, const std::vector<Symbol>& symbols);

// The value with symbol i bound to env[i]; false on int64 overflow or a zero divisor.
// floordiv and mod round toward negative infinity (Python's // and %).
bool evaluate(const SizeExpr& e, const int64_t* env, int64_t* out);

// Inclusive bounds over symbol values in [mins[i], maxs[i]] (interval arithmetic, exactly
// SizeExpr.bounds); false when not computable: a floordiv/mod divisor interval that may be
// zero or change sign, or an int64 overflow anywhere on the way.
bool bounds(const SizeExpr& e, const int64_t* mins, const int64_t* maxs, int64_t* lo,
            int64_t* hi);

// a * s + b for one symbol s (linear_form in symbolic.py): false if not of that form or if
// a or b overflows int64.
struct Affine { int symbol; int64_t a; int64_t b; };
bool as_affine(const SizeExpr& e, Affine* out);

// The symbol of linear_form(e) whatever the size of its coefficients (Python's ints do not
// overflow, so a symbol is bound by such a dimension there too); -1 if not linear.
int affine_symbol(const SizeExpr& e);

// floordiv/mod rounding toward negative infinity; false on a zero divisor or overflow.
bool floor_div(int64_t a, int64_t b, int64_t* out);
bool floor_mod(int64_t a, int64_t b, int64_t* out);

}  // namespace opforge::rt
