// Size expressions: the strict printed grammar, checked evaluation, interval bounds and the
// affine form that binds a symbol. Mirrors opforge/program/symbolic.py; see symbolic.h.
#include "symbolic.h"

#include <algorithm>
#include <cstring>

namespace opforge::rt {
namespace {

const char* const kGrammar =
    "ints, symbols, (a + b), (a - b), (a * b), floordiv/mod/min/max(a, b)";

bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

std::string excerpt(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return "'" + out + "'";
}

// A parser of exactly the canonical spelling: Python's SizeExpr.parse tokenizes loosely and
// then requires str(expr) == text, which accepts precisely the canonical texts; reading only
// those is the same language, with no second printing pass.
class Parser {
 public:
  Parser(const std::string& text, const std::vector<Symbol>& symbols, const std::string& where,
         std::string* unknown)
      : text_(text), symbols_(symbols), where_(where), unknown_(unknown) {}

  SizeExpr run() {
    if (text_.empty() || text_.size() > kMaxExprText) {
      fail_plain("a non-empty expression of at most 1024 characters");
    }
    int depth = 0;
    parse(0, &depth);
    if (pos_ != text_.size()) fail("trailing text at character " + std::to_string(pos_));
    return std::move(expr_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw ProgramError{prefix() + "`SizeExpr.parse` — found " + excerpt(text_) + ": " + what +
                       " — valid: " + kGrammar + " (exactly as SizeExpr prints them)"};
  }
  [[noreturn]] void fail_plain(const std::string& valid) {
    throw ProgramError{prefix() + "`SizeExpr.parse` — found " + excerpt(text_) + " (" +
                       std::to_string(text_.size()) + " characters) — valid: " + valid};
  }

  std::string prefix() const { return where_.empty() ? "" : where_ + ": "; }
  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  void expect(const char* s) {
    size_t n = std::strlen(s);
    if (pos_ + n > text_.size() || text_.compare(pos_, n, s) != 0) {
      fail(std::string("expected '") + s + "' at character " + std::to_string(pos_));
    }
    pos_ += n;
  }

  int add(ExprNode node, int /*depth*/) {
    if (static_cast<int>(expr_.nodes.size()) >= kMaxExprNodes) {
      fail("more than 64 nodes");
    }
    expr_.nodes.push_back(node);
    return static_cast<int>(expr_.nodes.size()) - 1;
  }

  // Parses one expression at nesting `level` (0 = root); returns its node index and sets
  // *depth to its height (a leaf is 1).
  int parse(int level, int* depth) {
    if (level >= kMaxExprDepth) fail("nested deeper than 16");
    if (pos_ >= text_.size()) fail("ends too early");
    char c = text_[pos_];
    if (c == '-' || (c >= '0' && c <= '9')) return parse_int(depth);
    if (is_name_start(c)) {
      size_t start = pos_;
      while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
      std::string name = text_.substr(start, pos_ - start);
      ExprOp op = ExprOp::Sym;
      if (at('(')) {
        if (name == "floordiv") op = ExprOp::FloorDiv;
        else if (name == "mod") op = ExprOp::Mod;
        else if (name == "min") op = ExprOp::Min;
        else if (name == "max") op = ExprOp::Max;
        else fail("unexpected '(' after the symbol " + name);
        ++pos_;
        int da = 0, db = 0;
        int a = parse(level + 1, &da);
        expect(", ");
        int b = parse(level + 1, &db);
        expect(")");
        *depth = 1 + std::max(da, db);
        return add(ExprNode{op, 0, static_cast<int16_t>(a), static_cast<int16_t>(b)}, *depth);
      }
      int index = -1;
      for (size_t i = 0; i < symbols_.size(); ++i) {
        if (symbols_[i].name == name) { index = static_cast<int>(i); break; }
      }
      if (index < 0 && unknown_ != nullptr) {
        if (unknown_->empty()) *unknown_ = name;
      } else if (index < 0) {
        throw ProgramError{prefix() + "`SizeExpr` — found " + excerpt(text_) +
                           " reads undeclared symbol '" + name +
                           "' — valid: expressions over the method's symbols — fix: the file "
                           "is corrupt or hostile; re-export the model"};
      }
      *depth = 1;
      return add(ExprNode{ExprOp::Sym, index, -1, -1}, 1);
    }
    if (c == '(') {
      ++pos_;
      int da = 0, db = 0;
      int a = parse(level + 1, &da);
      ExprOp op;
      if (text_.compare(pos_, 3, " + ") == 0) op = ExprOp::Add;
      else if (text_.compare(pos_, 3, " - ") == 0) op = ExprOp::Sub;
      else if (text_.compare(pos_, 3, " * ") == 0) op = ExprOp::Mul;
      else fail("expected ' + ', ' - ' or ' * ' inside parentheses");
      pos_ += 3;
      int b = parse(level + 1, &db);
      expect(")");
      *depth = 1 + std::max(da, db);
      return add(ExprNode{op, 0, static_cast<int16_t>(a), static_cast<int16_t>(b)}, *depth);
    }
    fail(std::string("unexpected character at ") + std::to_string(pos_));
  }

  // Canonical decimal: an optional '-', no leading zero (except "0"), no "-0", int64.
  int parse_int(int* depth) {
    size_t start = pos_;
    bool negative = at('-');
    if (negative) ++pos_;
    size_t digits = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    size_t n = pos_ - digits;
    if (n == 0) fail("a '-' without digits");
    if ((n > 1 && text_[digits] == '0') || (negative && n == 1 && text_[digits] == '0')) {
      fail("the integer " + text_.substr(start, pos_ - start) + " is not in canonical form");
    }
    // accumulate as a negative number so that INT64_MIN is representable
    int64_t v = 0;
    for (size_t i = digits; i < pos_; ++i) {
      int d = text_[i] - '0';
      if (v < (INT64_MIN + d) / 10) fail(text_.substr(start, pos_ - start) + " is not an int64");
      v = v * 10 - d;
    }
    if (!negative) {
      if (v == INT64_MIN) fail(text_.substr(start, pos_ - start) + " is not an int64");
      v = -v;
    }
    *depth = 1;
    return add(ExprNode{ExprOp::Int, v, -1, -1}, 1);
  }

  const std::string& text_;
  const std::vector<Symbol>& symbols_;
  const std::string& where_;
  std::string* unknown_;
  size_t pos_ = 0;
  SizeExpr expr_;
};

bool checked(ExprOp op, int64_t a, int64_t b, int64_t* out) {
  switch (op) {
    case ExprOp::Add: return !__builtin_add_overflow(a, b, out);
    case ExprOp::Sub: return !__builtin_sub_overflow(a, b, out);
    case ExprOp::Mul: return !__builtin_mul_overflow(a, b, out);
    case ExprOp::FloorDiv: return floor_div(a, b, out);
    case ExprOp::Mod: return floor_mod(a, b, out);
    case ExprOp::Min: *out = std::min(a, b); return true;
    case ExprOp::Max: *out = std::max(a, b); return true;
    default: return false;
  }
}

void print(const SizeExpr& e, int i, const std::vector<Symbol>& symbols, std::string* out) {
  const ExprNode& n = e.nodes[i];
  switch (n.op) {
    case ExprOp::Int: *out += std::to_string(n.value); return;
    case ExprOp::Sym:
      *out += n.value >= 0 && static_cast<size_t>(n.value) < symbols.size()
                  ? symbols[n.value].name : "?";
      return;
    case ExprOp::Add: case ExprOp::Sub: case ExprOp::Mul:
      *out += '(';
      print(e, n.lhs, symbols, out);
      *out += n.op == ExprOp::Add ? " + " : n.op == ExprOp::Sub ? " - " : " * ";
      print(e, n.rhs, symbols, out);
      *out += ')';
      return;
    default:
      *out += n.op == ExprOp::FloorDiv ? "floordiv(" : n.op == ExprOp::Mod ? "mod("
              : n.op == ExprOp::Min ? "min(" : "max(";
      print(e, n.lhs, symbols, out);
      *out += ", ";
      print(e, n.rhs, symbols, out);
      *out += ')';
  }
}

// linear_form over node i: (symbol, a, b); *overflow set when a coefficient left int64
// (the form is still linear: Python's ints do not overflow).
bool linear(const SizeExpr& e, int i, Affine* f, bool* overflow) {
  const ExprNode& n = e.nodes[i];
  if (n.op == ExprOp::Sym) {
    *f = Affine{static_cast<int>(n.value), 1, 0};
    return true;
  }
  if (n.op != ExprOp::Add && n.op != ExprOp::Sub && n.op != ExprOp::Mul) return false;
  const ExprNode& l = e.nodes[n.lhs];
  const ExprNode& r = e.nodes[n.rhs];
  if (n.op == ExprOp::Mul) {
    if (l.op != ExprOp::Int && r.op != ExprOp::Int) return false;
    int64_t k = l.op == ExprOp::Int ? l.value : r.value;
    int other = l.op == ExprOp::Int ? n.rhs : n.lhs;
    if (!linear(e, other, f, overflow) || k == 0) return false;
    if (__builtin_mul_overflow(f->a, k, &f->a)) *overflow = true;
    if (__builtin_mul_overflow(f->b, k, &f->b)) *overflow = true;
    return true;
  }
  if (r.op == ExprOp::Int) {
    if (!linear(e, n.lhs, f, overflow)) return false;
    bool bad = n.op == ExprOp::Add ? __builtin_add_overflow(f->b, r.value, &f->b)
                                   : __builtin_sub_overflow(f->b, r.value, &f->b);
    if (bad) *overflow = true;
    return true;
  }
  if (l.op == ExprOp::Int && n.op == ExprOp::Add) {
    if (!linear(e, n.rhs, f, overflow)) return false;
    if (__builtin_add_overflow(f->b, l.value, &f->b)) *overflow = true;
    return true;
  }
  return false;
}

}  // namespace

bool floor_div(int64_t a, int64_t b, int64_t* out) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return false;
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  *out = q;
  return true;
}

bool floor_mod(int64_t a, int64_t b, int64_t* out) {
  if (b == 0) return false;
  if (b == -1) { *out = 0; return true; }
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  *out = m;
  return true;
}

bool SizeExpr::reads(int s) const {
  for (const ExprNode& n : nodes) {
    if (n.op == ExprOp::Sym && n.value == s) return true;
  }
  return false;
}

bool SizeExpr::is_symbolic() const {
  for (const ExprNode& n : nodes) {
    if (n.op == ExprOp::Sym) return true;
  }
  return false;
}

SizeExpr parse_size_expr(const std::string& text, const std::vector<Symbol>& symbols,
                         const std::string& where) {
  return Parser(text, symbols, where, nullptr).run();
}

SizeExpr parse_size_expr(const std::string& text, const std::vector<Symbol>& symbols,
                         const std::string& where, std::string* unknown) {
  return Parser(text, symbols, where, unknown).run();
}

std::string to_string(const SizeExpr& e, const std::vector<Symbol>& symbols) {
  std::string out;
  if (!e.nodes.empty()) print(e, e.root(), symbols, &out);
  return out;
}

bool evaluate(const SizeExpr& e, const int64_t* env, int64_t* out) {
  int64_t v[kMaxExprNodes];
  const size_t count = e.nodes.size();
  if (count == 0 || count > static_cast<size_t>(kMaxExprNodes)) return false;
  for (size_t i = 0; i < count; ++i) {
    const ExprNode& n = e.nodes[i];
    if (n.op == ExprOp::Int) v[i] = n.value;
    else if (n.op == ExprOp::Sym) v[i] = env[n.value];
    else if (!checked(n.op, v[n.lhs], v[n.rhs], &v[i])) return false;
  }
  *out = v[count - 1];
  return true;
}

bool bounds(const SizeExpr& e, const int64_t* mins, const int64_t* maxs, int64_t* lo,
            int64_t* hi) {
  int64_t L[kMaxExprNodes], H[kMaxExprNodes];
  const size_t count = e.nodes.size();
  if (count == 0 || count > static_cast<size_t>(kMaxExprNodes)) return false;
  for (size_t i = 0; i < count; ++i) {
    const ExprNode& n = e.nodes[i];
    if (n.op == ExprOp::Int) { L[i] = H[i] = n.value; continue; }
    if (n.op == ExprOp::Sym) { L[i] = mins[n.value]; H[i] = maxs[n.value]; continue; }
    const int64_t al = L[n.lhs], ah = H[n.lhs], bl = L[n.rhs], bh = H[n.rhs];
    switch (n.op) {
      case ExprOp::Add:
        if (__builtin_add_overflow(al, bl, &L[i]) || __builtin_add_overflow(ah, bh, &H[i]))
          return false;
        break;
      case ExprOp::Sub:
        if (__builtin_sub_overflow(al, bh, &L[i]) || __builtin_sub_overflow(ah, bl, &H[i]))
          return false;
        break;
      case ExprOp::Mul:
      case ExprOp::FloorDiv: {
        if (n.op == ExprOp::FloorDiv && !(bl > 0 || bh < 0)) return false;
        int64_t c[4];
        const int64_t xs[4] = {al, al, ah, ah}, ys[4] = {bl, bh, bl, bh};
        for (int k = 0; k < 4; ++k) {
          if (!checked(n.op, xs[k], ys[k], &c[k])) return false;
        }
        L[i] = std::min(std::min(c[0], c[1]), std::min(c[2], c[3]));
        H[i] = std::max(std::max(c[0], c[1]), std::max(c[2], c[3]));
        break;
      }
      case ExprOp::Mod:
        if (!(bl > 0)) return false;
        if (al < 0 || ah >= bl) { L[i] = 0; H[i] = bh - 1; }
        else { L[i] = al; H[i] = ah; }
        break;
      case ExprOp::Min: L[i] = std::min(al, bl); H[i] = std::min(ah, bh); break;
      case ExprOp::Max: L[i] = std::max(al, bl); H[i] = std::max(ah, bh); break;
      default: return false;
    }
  }
  *lo = L[count - 1];
  *hi = H[count - 1];
  return true;
}

bool as_affine(const SizeExpr& e, Affine* out) {
  if (e.nodes.empty()) return false;
  bool overflow = false;
  Affine f{};
  if (!linear(e, e.root(), &f, &overflow) || overflow) return false;
  *out = f;
  return true;
}

int affine_symbol(const SizeExpr& e) {
  if (e.nodes.empty()) return -1;
  bool overflow = false;
  Affine f{};
  return linear(e, e.root(), &f, &overflow) ? f.symbol : -1;
}

}  // namespace opforge::rt
