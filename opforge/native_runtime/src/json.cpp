// The bounded JSON reader (json.h): an explicit stack instead of recursion.
#include "json.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace opforge::rt::json {
namespace {

constexpr size_t kMaxIntDigits = 4300;  // CPython's int <-> str conversion limit

class Parser {
 public:
  Parser(const std::string& s, Document* doc) : s_(s), doc_(doc) {}

  bool run(std::string* error) {
    struct Frame { uint32_t node; size_t kids_at; bool object; };
    std::vector<Frame> stack;
    std::vector<uint32_t> scratch;  // children of the open containers, in order
    ws();
    for (;;) {
      // expect a value (an object expects a key first)
      if (!stack.empty() && stack.back().object) {
        if (!at('"')) return bad(error, "expecting a property name in double quotes");
        uint32_t key;
        if (!string(&key)) return bad(error, err_);
        scratch.push_back(key);
        ws();
        if (!at(':')) return bad(error, "expecting ':'");
        ++pos_;
        ws();
      }
      uint32_t node;
      if (pos_ >= s_.size()) return bad(error, "expecting a value");
      const char c = s_[pos_];
      if (c == '[' || c == '{') {
        if (stack.size() >= size_t(kMaxJsonDepth)) return bad(error, "nested too deeply");
        ++pos_;
        node = add(Node{c == '[' ? Kind::Array : Kind::Object});
        ws();
        if (at(c == '[' ? ']' : '}')) {
          ++pos_;
        } else {
          stack.push_back(Frame{node, scratch.size(), c == '{'});
          continue;
        }
      } else if (!scalar(&node)) {
        return bad(error, err_);
      }
      // a complete value: append it to the open container, closing as many as end here
      for (;;) {
        if (stack.empty()) {
          ws();
          if (pos_ != s_.size()) return bad(error, "extra data");
          return true;
        }
        scratch.push_back(node);
        ws();
        if (at(',')) {
          ++pos_;
          ws();
          break;
        }
        const Frame f = stack.back();
        if (!at(f.object ? '}' : ']')) return bad(error, "expecting ',' delimiter");
        ++pos_;
        Node& n = doc_->nodes[f.node];
        n.first = static_cast<uint32_t>(doc_->kids.size());
        const size_t items = scratch.size() - f.kids_at;
        n.count = static_cast<uint32_t>(f.object ? items / 2 : items);
        doc_->kids.insert(doc_->kids.end(), scratch.begin() + f.kids_at, scratch.end());
        scratch.resize(f.kids_at);
        stack.pop_back();
        node = f.node;
      }
    }
  }

  std::string err_;

 private:
  bool bad(std::string* error, const std::string& what) {
    *error = what + " at character " + std::to_string(pos_);
    return false;
  }
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool literal(const char* word) {
    size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  uint32_t add(Node n) {
    doc_->nodes.push_back(n);
    return static_cast<uint32_t>(doc_->nodes.size() - 1);
  }

  bool scalar(uint32_t* node) {
    const char c = s_[pos_];
    if (c == '"') return string(node);
    Node n;
    if (literal("null")) n.kind = Kind::Null;
    else if (literal("true")) n.kind = Kind::True;
    else if (literal("false")) n.kind = Kind::False;
    else if (literal("NaN")) { n.kind = Kind::Float; n.d = __builtin_nan(""); }
    else if (literal("Infinity")) { n.kind = Kind::Float; n.d = __builtin_inf(); }
    else if (literal("-Infinity")) { n.kind = Kind::Float; n.d = -__builtin_inf(); }
    else if (c == '-' || (c >= '0' && c <= '9')) return number(node);
    else { err_ = "expecting a value"; return false; }
    *node = add(n);
    return true;
  }

  bool digit() const { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? — json's NUMBER_RE; an int without
  // fraction or exponent, otherwise a float (Python's float() of the same text).
  bool number(uint32_t* node) {
    const size_t start = pos_;
    if (at('-')) ++pos_;
    if (!digit()) { err_ = "expecting a value"; return false; }
    if (s_[pos_] == '0') ++pos_;
    else while (digit()) ++pos_;
    bool is_float = false;
    if (at('.') && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9') {
      ++pos_;
      while (digit()) ++pos_;
      is_float = true;
    }
    if ((at('e') || at('E'))) {
      size_t save = pos_++;
      if (at('+') || at('-')) ++pos_;
      if (digit()) {
        while (digit()) ++pos_;
        is_float = true;
      } else {
        pos_ = save;
      }
    }
    const std::string token = s_.substr(start, pos_ - start);
    Node n;
    if (is_float) {
      n.kind = Kind::Float;
      n.d = std::strtod(token.c_str(), nullptr);  // inf on overflow, as float() gives
    } else {
      size_t digits = token.size() - (token[0] == '-');
      if (digits > kMaxIntDigits) { err_ = "an integer of more than 4300 digits"; return false; }
      errno = 0;
      long long v = std::strtoll(token.c_str(), nullptr, 10);
      if (errno == ERANGE) n.kind = Kind::BigInt;
      else { n.kind = Kind::Int; n.i = v; }
    }
    *node = add(n);
    return true;
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool u4(size_t at, uint32_t* out) const {
    if (at + 4 > s_.size()) return false;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      int h = hex(s_[at + k]);
      if (h < 0) return false;
      v = v << 4 | uint32_t(h);
    }
    *out = v;
    return true;
  }
  void put(uint32_t cp) {  // UTF-8 (lone surrogates as their 3-byte form)
    std::string& t = doc_->text;
    if (cp < 0x80) t += char(cp);
    else if (cp < 0x800) { t += char(0xC0 | cp >> 6); t += char(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      t += char(0xE0 | cp >> 12); t += char(0x80 | ((cp >> 6) & 0x3F)); t += char(0x80 | (cp & 0x3F));
    } else {
      t += char(0xF0 | cp >> 18); t += char(0x80 | ((cp >> 12) & 0x3F));
      t += char(0x80 | ((cp >> 6) & 0x3F)); t += char(0x80 | (cp & 0x3F));
    }
  }

  bool string(uint32_t* node) {
    ++pos_;  // the opening quote
    Node n;
    n.kind = Kind::String;
    n.first = static_cast<uint32_t>(doc_->text.size());
    uint32_t chars = 0;
    for (;;) {
      if (pos_ >= s_.size()) { err_ = "unterminated string"; return false; }
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') { ++pos_; break; }
      if (c < 0x20) { err_ = "invalid control character"; return false; }
      if (c != '\\') {
        doc_->text += char(c);
        chars += (c & 0xC0) != 0x80;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= s_.size()) { err_ = "unterminated string"; return false; }
      const char e = s_[pos_ + 1];
      pos_ += 2;
      ++chars;
      switch (e) {
        case '"': doc_->text += '"'; continue;
        case '\\': doc_->text += '\\'; continue;
        case '/': doc_->text += '/'; continue;
        case 'b': doc_->text += '\b'; continue;
        case 'f': doc_->text += '\f'; continue;
        case 'n': doc_->text += '\n'; continue;
        case 'r': doc_->text += '\r'; continue;
        case 't': doc_->text += '\t'; continue;
        case 'u': break;
        default: err_ = "invalid \\escape"; return false;
      }
      uint32_t cp;
      if (!u4(pos_, &cp)) { err_ = "invalid \\uXXXX escape"; return false; }
      pos_ += 4;
      uint32_t low;
      if (cp >= 0xD800 && cp <= 0xDBFF && pos_ + 1 < s_.size() && s_[pos_] == '\\' &&
          s_[pos_ + 1] == 'u' && u4(pos_ + 2, &low) && low >= 0xDC00 && low <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        pos_ += 6;
      }
      put(cp);
    }
    n.length = static_cast<uint32_t>(doc_->text.size() - n.first);
    n.count = chars;
    *node = add(n);
    return true;
  }

  const std::string& s_;
  Document* doc_;
  size_t pos_ = 0;
};

}  // namespace

int64_t Document::member(const Node& n, const std::string& key) const {
  int64_t found = -1;
  for (uint32_t k = 0; k < n.count; ++k) {
    const Node& name = nodes[kids[n.first + 2 * k]];
    if (name.length == key.size() && text.compare(name.first, name.length, key) == 0) {
      found = kids[n.first + 2 * k + 1];
    }
  }
  return found;
}

bool parse(const std::string& text, Document* doc, std::string* error) {
  if (text.size() >= 0xFFFFFFFFu) {
    *error = "a text of 4 GiB or more";
    return false;
  }
  doc->nodes.clear();
  doc->kids.clear();
  doc->text.clear();
  Parser p(text, doc);
  return p.run(error);
}

}  // namespace opforge::rt::json
