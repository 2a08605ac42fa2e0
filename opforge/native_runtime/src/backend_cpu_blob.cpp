// The cpu blob's header and plan checks (backend_cpu_blob.h), rule for rule as blob.py's
// parse, check_plan, _check_named, _check_state and _check_debug, with their messages:
// here the header, the CRC, the JSON plan and a dynamic plan's symbols; the per-tensor,
// per-op, io, state and debug field checks are in backend_cpu_blob_ops.cpp.
#include "backend_cpu_blob.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "backend_cpu_json.h"
#include "errors.h"
#include "program_text.h"
#include "symbolic.h"

namespace opforge::rt::cpu {
using namespace blob_detail;

[[noreturn]] void blob_detail::refuse(const std::string& what) {
  raise(OPF_ERR_PROGRAM, "cpu backend blob: " + what +
                             " — valid: a blob written by this opforge's cpu backend — fix: "
                             "re-export the program; this one was altered, corrupted, or written "
                             "by an incompatible version");
}

namespace {

constexpr char kMagic[8] = {'O', 'F', 'C', 'P', 'U', 'B', 'L', 'B'};
constexpr size_t kHeader = 32;

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n) {
  static uint32_t table[256];
  static bool made = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)made;
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// Strict UTF-8 (Python's bytes.decode("utf-8")): no overlong forms, no surrogates.
bool utf8_ok(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = p[i];
    if (c < 0x80) { ++i; continue; }
    int len = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || n - i < (size_t)len) return false;
    for (int k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    if (c == 0xE0 && p[i + 1] < 0xA0) return false;
    if (c == 0xED && p[i + 1] >= 0xA0) return false;
    if (c == 0xF0 && p[i + 1] < 0x90) return false;
    if (c == 0xF4 && p[i + 1] >= 0x90) return false;
    i += (size_t)len;
  }
  return true;
}

uint32_t u32(const uint8_t* p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
uint64_t u64(const uint8_t* p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

}  // namespace

bool valid_utf8(const uint8_t* p, size_t n) { return utf8_ok(p, n); }

int64_t dtype_itemsize(int32_t dtype) {
  switch (dtype) {
    case 0: case 1: case 11: return 1;
    case 2: case 5: case 15: return 2;  // (float16, bfloat16: a KV cache's storage)
    case 3: case 6: return 4;
    case 4: case 7: return 8;
    default: return 0;
  }
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case 0: return "uint8"; case 1: return "int8"; case 2: return "int16"; case 3: return "int32";
    case 4: return "int64"; case 5: return "float16"; case 6: return "float32";
    case 7: return "float64"; case 11: return "bool"; case 15: return "bfloat16";
    default: return "unknown";
  }
}

struct Blob::Exprs : ExprTable {
  std::map<std::string, std::pair<int64_t, int64_t>> bounds;  // by text, over the ranges
};

Blob::~Blob() = default;

Blob::Blob(const uint8_t* blob, size_t size) : json_(std::make_unique<Json>()) {
  if (size < kHeader)
    refuse(std::to_string(size) + " bytes, shorter than its " + std::to_string(kHeader) + "-byte header");
  if (std::memcmp(blob, kMagic, 8) != 0) refuse("magic that is not b'OFCPUBLB'");
  version_ = u32(blob + 8);
  if (version_ != 1 && version_ != 2)
    refuse("format version " + std::to_string(version_) + "; this opforge reads versions (1, 2)");
  const int64_t plan_len = u32(blob + 12);
  const uint64_t data_len = u64(blob + 16);
  const uint32_t crc = u32(blob + 24);
  if (plan_len > kMaxPlan) refuse("plan of " + std::to_string(plan_len) + " bytes");
  const int64_t data_start = align64((int64_t)kHeader + plan_len);
  if ((uint64_t)data_start > size || data_len != (uint64_t)size - (uint64_t)data_start)
    refuse("sizes (plan " + std::to_string(plan_len) + ", data " + std::to_string(data_len) +
           ") that do not add up to the blob's " + std::to_string(size) + " bytes");
  const uint8_t* text = blob + kHeader;
  data_ = blob + data_start;
  data_size_ = (int64_t)data_len;
  if (crc32_update(crc32_update(0, text, (size_t)plan_len), data_, (size_t)data_len) != crc)
    refuse("a CRC-32 that does not match its contents");
  Json& j = *json_;
  std::string problem;
  if (!utf8_ok(text, (size_t)plan_len)) refuse("a plan that is not JSON (UnicodeDecodeError)");
  if (!j.parse(reinterpret_cast<const char*>(text), (size_t)plan_len, &problem))
    refuse("a plan that is not JSON (" + problem + ")");
  const JValue& doc = j.root();
  if (doc.type != JType::Object) refuse("a plan that is not an object");
  const JValue* tensors = j.member(doc, "tensors");
  bool names = false;
  for (uint32_t k = 0; tensors && tensors->type == JType::Array && k < tensors->count; ++k)
    names = names || j.member(j.item(*tensors, k), "named") != nullptr;
  if (version_ < 2 && names)
    refuse("a version-" + std::to_string(version_) + " blob that names constants (version 2 or later)");
  if (j.member(doc, "symbols") != nullptr) {  // a dynamic method's delegate (cpu/dynamic.py)
    check_symbolic();
    return;
  }
  plan();  // every check_plan rule now (the handle makes it again: the Json is kept)
}

Plan Blob::plan_at(const std::vector<int64_t>& env) const {
  const Json& j = *json_;
  const JValue& doc = j.root();
  Plan plan;
  plan.version = version_;
  plan.data = data_;
  plan.data_size = data_size_;
  const ExprTable* exprs = nullptr;
  if (symbolic()) {
    if (env.size() != symbols_.size()) refuse("symbol values of another count than its symbols");
    exprs_->env = &env;
    exprs = exprs_.get();
  }
  check_plan_doc(j, doc, exprs, plan);
  return plan;
}

// check_symbolic (cpu/dynamic.py), rule for rule.
void Blob::check_symbolic() {
  const Json& j = *json_;
  const JValue& doc = j.root();
  const JValue* symbols = j.member(doc, "symbols");
  if (symbols == nullptr || symbols->type != JType::Array || symbols->count < 1 || symbols->count > kMaxSymbols)
    refuse("symbols is not a list of 1 to " + std::to_string(kMaxSymbols) + " [name, min, max]");
  for (uint32_t k = 0; k < symbols->count; ++k) {
    const JValue& e = j.item(*symbols, k);
    std::string at = "symbols[" + std::to_string(k) + "]";
    if (e.type != JType::Array || e.count != 3 || j.item(e, 0).type != JType::String)
      refuse(at + " is not [name, min, max]");
    Symbol sym;
    sym.name = j.str(j.item(e, 0));
    if (!is_identifier(sym.name)) refuse(at + " name '" + sym.name.substr(0, 40) + "' is not an identifier");
    const JValue &lo = j.item(e, 1), &hi = j.item(e, 2);
    bool twice = std::any_of(symbols_.begin(), symbols_.end(), [&](const Symbol& s) { return s.name == sym.name; });
    if (lo.type != JType::Int || hi.type != JType::Int || lo.big || hi.big || lo.i < 0 || lo.i > hi.i ||
        hi.i > kBig || twice)
      refuse(at + " '" + sym.name.substr(0, 40) + "' has a range outside 0 <= min <= max <= " +
             std::to_string(kBig) + ", or is declared twice");
    sym.min = lo.i;
    sym.max = hi.i;
    symbols_.push_back(sym);
  }
  exprs_ = std::make_unique<Exprs>();
  std::vector<int64_t> mins, maxs;
  for (const Symbol& s : symbols_) {
    mins.push_back(s.min);
    maxs.push_back(s.max);
  }
  // an int in [lo, hi], or an expression that parses, reads declared symbols, and whose
  // bounds over the symbols' ranges lie in [lo, hi]
  auto check = [&](const JValue& v, int64_t lo, int64_t hi, const std::string& what) {
    if (v.type == JType::Int) {
      if (v.big || v.i < lo || v.i > hi)
        refuse(what + " is " + (v.big ? std::string("a big int") : std::to_string(v.i)) + ", not in [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return;
    }
    if (v.type != JType::String) refuse(what + " is neither an int nor a size expression");
    const std::string text = j.str(v);
    if (!exprs_->parsed.count(text)) {
      try {
        exprs_->parsed.emplace(text, parse_size_expr(text, symbols_, what));
      } catch (const ProgramError& e) {
        refuse(what + ": the size expression '" + text.substr(0, 60) + "' does not parse or reads an "
               "undefined symbol (" + e.message.substr(0, 160) + ")");
      }
      int64_t b_lo = 0, b_hi = 0;
      if (!bounds(exprs_->parsed.at(text), mins.data(), maxs.data(), &b_lo, &b_hi)) {
        b_lo = -(int64_t(1) << 62) - 1;
        b_hi = (int64_t(1) << 62) + 1;
      }
      exprs_->bounds[text] = {b_lo, b_hi};
    }
    auto b = exprs_->bounds.at(text);
    if (b.first < lo || b.second > hi)
      refuse(what + ": the size expression '" + text.substr(0, 60) + "' spans [" + std::to_string(b.first) + ", " +
             std::to_string(b.second) + "] over the symbols' ranges, outside [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]");
  };
  const JValue* tensors = j.member(doc, "tensors");
  const JValue* ops = j.member(doc, "ops");
  if (tensors == nullptr || tensors->type != JType::Array || ops == nullptr || ops->type != JType::Array)
    refuse("no tensor table or op list");
  for (uint32_t i = 0; i < tensors->count; ++i) {
    const JValue& t = j.item(*tensors, i);
    std::string at = "tensors[" + std::to_string(i) + "]";
    if (t.type != JType::Object) refuse(at + " is not an object");
    for (const char* key : {"dims", "strides"}) {
      const JValue* values = j.member(t, key);
      if (values == nullptr || values->type != JType::Array || values->count > kMaxRank)
        refuse(at + "." + key + " is not a list of at most " + std::to_string(kMaxRank) + " sizes");
      for (uint32_t k = 0; k < values->count; ++k) check(j.item(*values, k), 0, kBig, at + "." + key);
    }
    if (j.member(t, "dims")->count != j.member(t, "strides")->count)
      refuse(at + ": " + std::to_string(j.member(t, "dims")->count) + " dims but " +
             std::to_string(j.member(t, "strides")->count) + " strides");
    if (const JValue* offset = j.member(t, "offset")) check(*offset, 0, kBig, at + ".offset");
  }
  for (uint32_t i = 0; i < ops->count; ++i) {
    const JValue& op = j.item(*ops, i);
    const JValue* ia = op.type == JType::Object ? j.member(op, "ia") : nullptr;
    std::string at = "ops[" + std::to_string(i) + "].ia";
    if (ia == nullptr || ia->type != JType::Array || ia->count > 4096)
      refuse(at + " is not a list of at most 4096 attributes");
    for (uint32_t k = 0; k < ia->count; ++k) check(j.item(*ia, k), -(int64_t(1) << 62), int64_t(1) << 62, at);
  }
  const JValue* inputs = j.member(doc, "inputs");
  bool ids = inputs != nullptr && inputs->type == JType::Array;
  for (uint32_t k = 0; ids && k < inputs->count; ++k) {
    const JValue& v = j.item(*inputs, k);
    ids = v.type == JType::Int && !v.big && v.i >= 0 && v.i < (int64_t)tensors->count;
  }
  if (!ids) refuse("inputs is not a list of tensor ids");
  // each symbol bound by the first input dimension a * s + b that names it
  std::vector<char> bound(symbols_.size(), 0);
  for (uint32_t position = 0; position < inputs->count; ++position) {
    const JValue* dims = j.member(j.item(*tensors, (uint32_t)j.item(*inputs, position).i), "dims");
    for (uint32_t dim = 0; dim < dims->count; ++dim) {
      const JValue& size = j.item(*dims, dim);
      Affine form{};
      if (size.type != JType::String || !as_affine(exprs_->parsed.at(j.str(size)), &form) || form.a == 0 ||
          bound[(size_t)form.symbol])
        continue;
      bound[(size_t)form.symbol] = 1;
      steps_.push_back(Step{position, dim, form.symbol, form.a, form.b});
    }
  }
  for (const auto& kv : exprs_->parsed)
    for (size_t s = 0; s < symbols_.size(); ++s)
      if (kv.second.reads((int)s) && !bound[s])
        refuse("symbol(s) ['" + symbols_[s].name.substr(0, 40) + "'] that no input dimension binds");
  plan_at(mins);
  plan_at(maxs);
}

}  // namespace opforge::rt::cpu
