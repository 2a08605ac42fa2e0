// Shared by reader.cpp and reader_header.cpp: the error helper, the little-endian loads,
// the bounds-checked metadata cursor (Reader) and the file header check. See reader.cpp for
// the safety rules every read here keeps.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "program.h"
#include "program_text.h"

namespace opforge::rt::reader_detail {

constexpr uint64_t kHeaderSize = 64;
constexpr uint64_t kAlignment = 64;
inline const char* const kReexport = "re-export the model with this opforge version";
inline const char* const kCorrupt = "the file is corrupt; re-export it";

[[noreturn]] void fail(const std::string& subject, const std::string& found,
                       const std::string& valid, const std::string& fix = "");

inline uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | uint64_t(le32(p + 4)) << 32; }

// Runs fn; a ProgramError from it gets "what: " in front (decode.py's _in).
template <typename Fn>
auto in(const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (ProgramError& e) {
    e.message = what + ": " + e.message;
    throw;
  }
}

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, uint64_t base) : p_(p), end_(n), base_(base) {}

  const uint8_t* take(size_t n) {
    if (n > end_ - pos_) short_of(n);
    const uint8_t* at = p_ + pos_;
    pos_ += n;
    return at;
  }
  uint8_t u8() { return *take(1); }
  uint32_t u32() { return le32(take(4)); }
  int64_t i64() { return static_cast<int64_t>(le64(take(8))); }
  double f64() {
    uint64_t bits = le64(take(8));
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  // A u32 count whose elements (at least min_item_bytes each) fit in the bytes left.
  uint32_t count(uint64_t min_item_bytes) {
    uint32_t n = u32();
    if (uint64_t(n) * min_item_bytes > end_ - pos_) {
      fail("metadata at file offset " + std::to_string(base_ + pos_ - 4),
           "count " + std::to_string(n) + " (≥ " + std::to_string(uint64_t(n) * min_item_bytes) +
               " bytes) but only " + std::to_string(end_ - pos_) +
               " bytes left in the metadata section",
           "a count whose elements fit in the section", "the file is corrupt; re-export it");
    }
    return n;
  }
  // The memory the decoded tables take, charged before each is allocated against a budget
  // (the load's memory limit): a one-byte None becomes a ~200-byte Value, so a file of tiny
  // items would otherwise expand to ~200x its size.
  void set_budget(int64_t bytes) { budget_ = bytes > 0 ? uint64_t(bytes) : UINT64_MAX; }
  void charge(uint64_t bytes, const std::string& what) {
    if (bytes > budget_ - used_) over_budget(bytes, what);
    used_ += bytes;
  }
  uint64_t charged() const { return used_; }
  std::string raw() {
    uint32_t n = count(1);
    charge(sizeof(std::string) + n, "a string");
    const uint8_t* at = take(n);
    return std::string(reinterpret_cast<const char*>(at), n);
  }
  std::string string() {
    size_t at = pos_;
    std::string s = raw();
    size_t bad = 0;
    if (!valid_utf8(s, &bad)) {
      fail("metadata string at file offset " + std::to_string(base_ + at),
           "invalid UTF-8 at byte " + std::to_string(bad), "a UTF-8 string",
           "the file is corrupt; re-export it");
    }
    return s;
  }
  std::vector<uint32_t> u32s() {
    uint32_t n = count(4);
    charge(uint64_t(n) * 4, "a list of " + std::to_string(n) + " indices");
    std::vector<uint32_t> out(n);
    const uint8_t* at = take(size_t(n) * 4);
    for (uint32_t i = 0; i < n; ++i) out[i] = le32(at + 4 * i);
    return out;
  }
  std::vector<int64_t> i64s() {
    uint32_t n = count(8);
    charge(uint64_t(n) * 8, "a list of " + std::to_string(n) + " numbers");
    std::vector<int64_t> out(n);
    const uint8_t* at = take(size_t(n) * 8);
    for (uint32_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(le64(at + 8 * i));
    return out;
  }
  void expect_end() {
    if (pos_ != end_) {
      fail("metadata at file offset " + std::to_string(base_ + pos_),
           std::to_string(end_ - pos_) + " unread bytes after the last table",
           "a metadata section that ends with its last table",
           "the file is corrupt or was written by a different opforge; re-export it");
    }
  }

 private:
  [[noreturn]] void short_of(size_t n) {
    fail("metadata at file offset " + std::to_string(base_ + pos_),
         std::to_string(n) + " bytes needed but only " + std::to_string(end_ - pos_) +
             " left in the metadata section",
         "a complete metadata section", "the file is truncated or corrupt; re-export it");
  }
  [[noreturn]] void over_budget(uint64_t bytes, const std::string& what) {
    fail("decoded tables", std::to_string(used_ + bytes) + " bytes in memory with " + what +
             " (from " + std::to_string(end_) + " bytes of metadata)",
         "at most the memory limit, " + std::to_string(budget_) + " bytes",
         "1. check that the file is the one exported (a hostile file of tiny values asks for "
         "~200 times its size); 2. if the model really has this many values, raise the limit: "
         "opf_load_options.max_memory or OPFORGE_MAX_MEMORY=N");
  }
  const uint8_t* p_;
  size_t pos_ = 0, end_;
  uint64_t base_;
  uint64_t budget_ = UINT64_MAX, used_ = 0;
};

struct Header {
  uint32_t version;
  uint64_t metadata_offset, metadata_size, data_offset;
};

// The 64-byte header: magic, version, sizes, flags and the metadata CRC-32 (throws ProgramError).
Header check_header(const uint8_t* data, size_t size);

}  // namespace opforge::rt::reader_detail
