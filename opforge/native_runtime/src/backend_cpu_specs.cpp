// The cpu backend's compile specs at run time, decoded as strictly as
// opforge/backends/compile_specs.py decode_specs does with cpu/__init__.py's definitions:
// every stored key known, its type letter right, its text valid for its type. Only
// num_threads matters to the engine; the others are checked so that a program the Python
// runtime refuses is refused here too.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "backend_cpu_blob.h"
#include "backend_cpu_json.h"
#include "errors.h"

namespace opforge::rt::cpu {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string stripped(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

int digit_of(char c, int base) {
  int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : c >= 'A' && c <= 'Z' ? c - 'A' + 10 : 99;
  return d < base ? d : -1;
}

// Python's int(text, 0): optional sign, 0x / 0o / 0b prefixes, single underscores between
// digits, no leading zeros on a nonzero decimal. Saturates at 2^62 (Python's ints do not
// end; nothing here uses more). False when Python raises ValueError.
bool python_int(const std::string& raw, int64_t* out) {
  std::string s = stripped(raw);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  int base = 10;
  bool prefixed = false;
  if (s.size() - i >= 2 && s[i] == '0') {
    char p = (char)(s[i + 1] | 0x20);
    base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 10;
    if (base != 10) {
      i += 2;
      prefixed = true;
    }
  }
  if (i >= s.size()) return false;
  int64_t value = 0;
  bool last_digit = prefixed;  // after a prefix, one underscore may come first ("0x_1f")
  bool any = false, nonzero = false, leading_zero = false;
  for (size_t k = i; k < s.size(); ++k) {
    if (s[k] == '_') {
      if (!last_digit) return false;
      last_digit = false;
      continue;
    }
    int d = digit_of(s[k], base);
    if (d < 0) return false;
    if (!any && d == 0 && base == 10) leading_zero = true;
    if (d != 0) nonzero = true;
    any = true;
    last_digit = true;
    value = value > (int64_t(1) << 62) / base ? int64_t(1) << 62 : std::min<int64_t>(value * base + d, int64_t(1) << 62);
  }
  if (!any || !last_digit) return false;
  if (base == 10 && leading_zero && nonzero) return false;  // "010"
  *out = negative ? -value : value;
  return true;
}

[[noreturn]] void bad_value(const std::string& key, const std::string& text, const std::string& problem,
                            const char* help) {
  std::string shown;
  for (char c : text.substr(0, 40)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
  raise(OPF_ERR_PROGRAM, "backend 'cpu' compile spec '" + key + "': value '" + shown + "' — " + problem +
                             " — valid: " + help + " — fix: re-export the program; this one was "
                             "altered or corrupted");
}

}  // namespace

int64_t decode_num_threads(const std::vector<std::pair<std::string, std::string>>& specs) {
  static const struct { const char* key; char letter; const char* help; } kDefs[] = {
      {"num_threads", 'i', "engine threads; 0 = OPFORGE_NUM_THREADS, else 1"},
      {"custom_ops", 'j', "custom ops ('ns::op') whose native kernels the delegate calls through the kernel ABI"},
      {"op_packages", 'j', "OpPackageInfo dicts: op packages that implement or override ops"},
      {"fuse", 'b', "fuse elementwise ops into convolution/matmul/binary as oneDNN post-ops"},
      {"min_ops", 'i', "smallest partition worth a delegate call"}};
  int64_t threads = 0;
  for (const auto& kv : specs) {
    const auto* def = std::find_if(std::begin(kDefs), std::end(kDefs),
                                   [&](const auto& d) { return kv.first == d.key; });
    if (def == std::end(kDefs))
      raise(OPF_ERR_PROGRAM, "backend 'cpu': the program stores compile spec '" + kv.first.substr(0, 80) +
                                 "', which this backend does not know — valid: num_threads, custom_ops, "
                                 "op_packages, fuse, min_ops — fix: load the program with the opforge "
                                 "version that exported it, or re-export it");
    if (kv.second.size() < 2 || kv.second[0] != def->letter || kv.second[1] != ':')
      raise(OPF_ERR_PROGRAM, "backend 'cpu': stored compile spec '" + kv.first + "' is not a '" +
                                 def->letter + ":' value — valid: what export writes — fix: "
                                 "re-export the program; this one was altered or corrupted");
    const std::string text = kv.second.substr(2);
    if (!valid_utf8(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
      bad_value(kv.first, text, "not UTF-8", def->help);
    if (def->letter == 'i') {
      int64_t value = 0;
      if (!python_int(text, &value)) bad_value(kv.first, text, "not an int", def->help);
      if (kv.first == "num_threads" && value < 0) bad_value(kv.first, text, "negative", def->help);
      if (kv.first == "min_ops" && value < 1) bad_value(kv.first, text, "below 1", def->help);
      if (kv.first == "num_threads") threads = value;
    } else if (def->letter == 'b') {
      std::string word = stripped(text);
      for (char& c : word) c = (char)std::tolower((unsigned char)c);
      static const char* const kWords[] = {"1", "true", "yes", "on", "0", "false", "no", "off"};
      if (std::none_of(std::begin(kWords), std::end(kWords), [&](const char* w) { return word == w; }))
        bad_value(kv.first, text, "not a bool", def->help);
    } else {
      Json j;
      std::string problem;
      if (!j.parse(text.data(), text.size(), &problem)) bad_value(kv.first, text, "not a json", def->help);
      if (j.root().type != JType::Array) bad_value(kv.first, text, "not a JSON list", def->help);
    }
  }
  return threads;
}

}  // namespace opforge::rt::cpu
