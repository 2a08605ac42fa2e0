// NumPy .npy files for the tools (opforge-run, opforge-generate): read an untrusted file
// into a dense little-endian tensor, and write one back. Header-only: each tools/*.cpp is
// one executable.
//
// The format (numpy.lib.format): the magic "\x93NUMPY", a major and minor version byte
// (1.0, 2.0 or 3.0), the header's length (uint16 little-endian in 1.0, uint32 in 2.0 and
// 3.0), then the header: a Python dict literal such as
//     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n', then the data in C order.
//
// Reading is bounds-checked from the first byte: the header is parsed by a small reader
// of exactly that literal (strings, True/False, a tuple of integers; never evaluated), the
// element count is multiplied with overflow checks, and the data must be exactly the
// bytes that follow the header. Refused with a message saying why: big-endian data,
// fortran_order True, object/structured/string dtypes, a bool byte other than 0 or 1.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace opforge::tools {

// A dense C-order tensor in host (little-endian) byte order.
struct NpyArray {
  int32_t dtype = -1;  // a c10::ScalarType number
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
};

struct NpyType {
  const char* descr;  // the kind and size after the byte-order character ("f4")
  int32_t dtype;      // c10::ScalarType
  int64_t itemsize;
};

inline const NpyType* npy_types() {
  static const NpyType types[] = {
      {"f4", 6, 4},  {"f8", 7, 8},  {"f2", 5, 2},  {"i8", 4, 8},  {"i4", 3, 4},
      {"i2", 2, 2},  {"i1", 1, 1},  {"u1", 0, 1},  {"b1", 11, 1}, {"u2", 27, 2},
      {"u4", 28, 4}, {"u8", 29, 8}, {"c8", 9, 8},  {"c16", 10, 16}, {nullptr, -1, 0}};
  return types;
}

inline const NpyType* npy_type_of(int32_t dtype) {
  for (const NpyType* t = npy_types(); t->descr; ++t)
    if (t->dtype == dtype) return t;
  return nullptr;
}

inline int64_t npy_itemsize(int32_t dtype) {
  const NpyType* t = npy_type_of(dtype);
  return t ? t->itemsize : 0;
}

// The header dict literal, read without evaluating anything.
class NpyHeaderReader {
 public:
  explicit NpyHeaderReader(const std::string& text) : s_(text) {}

  // false with *why set on anything but {'descr': str, 'fortran_order': bool, 'shape': tuple}
  bool parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape, std::string* why) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip();
    if (!eat('{')) return fail(why, "the header is not a dict literal ('{' expected)");
    for (;;) {
      skip();
      if (eat('}')) break;
      std::string key;
      if (!string(&key)) return fail(why, "a dict key that is not a quoted string");
      skip();
      if (!eat(':')) return fail(why, "no ':' after key '" + key + "'");
      skip();
      if (key == "descr") {
        if (!string(descr))
          return fail(why, "'descr' is not a string (a structured dtype, which is not supported)");
        have_descr = true;
      } else if (key == "fortran_order") {
        if (match("True")) *fortran = true;
        else if (match("False")) *fortran = false;
        else return fail(why, "'fortran_order' is not True or False");
        have_fortran = true;
      } else if (key == "shape") {
        if (!tuple(shape, why)) return false;
        have_shape = true;
      } else {
        return fail(why, "an unknown key '" + key + "'");
      }
      skip();
      if (eat(',')) continue;
      skip();
      if (eat('}')) break;
      return fail(why, "no ',' or '}' after the value of '" + key + "'");
    }
    skip();
    if (pos_ != s_.size()) return fail(why, "text after the dict");
    if (!have_descr || !have_fortran || !have_shape)
      return fail(why, "the keys 'descr', 'fortran_order' and 'shape' are not all there");
    return true;
  }

 private:
  bool fail(std::string* why, const std::string& text) {
    *why = text;
    return false;
  }
  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' ||
                                s_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool match(const char* word) {
    size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  bool string(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return false;
    char quote = s_[pos_++];
    out->clear();
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') return false;  // no escapes in a dtype string
      out->push_back(s_[pos_++]);
    }
    return eat(quote);
  }
  bool tuple(std::vector<int64_t>* shape, std::string* why) {
    shape->clear();
    if (!eat('(')) return fail(why, "'shape' is not a tuple");
    for (;;) {
      skip();
      if (eat(')')) return true;
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9')
        return fail(why, "a 'shape' entry that is not a non-negative integer");
      int64_t value = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        int digit = s_[pos_++] - '0';
        if (value > (INT64_MAX - digit) / 10) return fail(why, "a 'shape' entry over int64");
        value = value * 10 + digit;
      }
      if (eat('L')) {}  // Python 2's long suffix, as numpy still accepts
      if (shape->size() >= 64) return fail(why, "more than 64 dimensions");
      shape->push_back(value);
      skip();
      if (eat(',')) continue;
      skip();
      if (eat(')')) return true;
      return fail(why, "no ',' or ')' in 'shape'");
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

inline bool npy_fail(std::string* error, const std::string& path, const std::string& found,
                     const std::string& fix) {
  *error = "input '" + path + "' — " + found + " — valid: a NumPy .npy file (version 1.0, 2.0 "
           "or 3.0) of a little-endian numeric or bool dtype in C order — fix: " + fix;
  return false;
}

// Read path into *out; false with *error (api — subject — found — valid — fix) otherwise.
inline bool npy_read(const std::string& path, NpyArray* out, std::string* error) {
  const std::string resave = "save it with numpy.save(path, numpy.ascontiguousarray(a))";
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return npy_fail(error, path, std::string("cannot open it (") + std::strerror(errno) + ")",
                    "check the path and its permissions");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return npy_fail(error, path, "not a regular file (a FIFO, device or directory)",
                    "save the data to a file first");
  }
  FILE* f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return npy_fail(error, path, "cannot read it", "check the file");
  }
  std::vector<unsigned char> bytes;
  unsigned char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes.insert(bytes.end(), buffer, buffer + n);
  bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error) return npy_fail(error, path, "a read error", "check the file");

  static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0)
    return npy_fail(error, path, "no .npy magic (\\x93NUMPY) at its start", resave);
  int major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    return npy_fail(error, path, "format version " + std::to_string(major) + "." +
                    std::to_string(minor), resave);
  size_t prefix = major == 1 ? 10 : 12;
  if (bytes.size() < prefix) return npy_fail(error, path, "a file cut inside its header", resave);
  uint64_t header_len = major == 1 ? (uint64_t)bytes[8] | ((uint64_t)bytes[9] << 8)
                                   : (uint64_t)bytes[8] | ((uint64_t)bytes[9] << 8) |
                                         ((uint64_t)bytes[10] << 16) | ((uint64_t)bytes[11] << 24);
  if (header_len > 100000)  // numpy itself refuses headers over 10000 bytes by default
    return npy_fail(error, path, "a header of " + std::to_string(header_len) + " bytes", resave);
  if (header_len > bytes.size() - prefix)
    return npy_fail(error, path, "a header longer than the file", resave);
  std::string header(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);
  for (unsigned char c : header)
    if (c == 0 || c >= 0x80)  // 3.0 allows UTF-8, but only in field names of structured dtypes
      return npy_fail(error, path, "a header with a NUL or non-ASCII byte", resave);

  std::string descr, why;
  bool fortran = false;
  std::vector<int64_t> shape;
  if (!NpyHeaderReader(header).parse(&descr, &fortran, &shape, &why))
    return npy_fail(error, path, "a header that cannot be read: " + why, resave);
  if (descr.size() < 2)
    return npy_fail(error, path, "dtype '" + descr + "'", "convert it to a numeric or bool dtype");
  char order = descr[0];
  std::string kind = descr.substr(1);
  if (order == '>' && kind != "i1" && kind != "u1" && kind != "b1")
    return npy_fail(error, path, "big-endian dtype '" + descr + "'",
                    "convert it: a.astype(a.dtype.newbyteorder('<'))");
  if (order != '<' && order != '|' && order != '=' && order != '>')
    return npy_fail(error, path, "dtype '" + descr + "'", "convert it to a numeric or bool dtype");
  const NpyType* type = nullptr;
  for (const NpyType* t = npy_types(); t->descr; ++t)
    if (kind == t->descr) type = t;
  if (type == nullptr)
    return npy_fail(error, path, "dtype '" + descr + "' (objects, strings, datetimes and "
                    "structured dtypes are not tensors)", "convert it to a numeric or bool dtype");
  if (fortran) {
    bool trivial = true;  // numpy writes 1-D and smaller arrays as C order; accept those
    int64_t big = 0;
    for (int64_t d : shape) big += d > 1;
    trivial = big <= 1;
    if (!trivial)
      return npy_fail(error, path, "fortran_order True", resave);
  }
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d != 0 && count > INT64_MAX / d)
      return npy_fail(error, path, "a shape whose element count overflows int64", resave);
    count *= d;
  }
  if (count > INT64_MAX / type->itemsize)
    return npy_fail(error, path, "a shape whose byte size overflows int64", resave);
  uint64_t need = (uint64_t)(count * type->itemsize);
  uint64_t have = bytes.size() - prefix - header_len;
  if (need != have)
    return npy_fail(error, path, "a header declaring " + descr + " of " +
                    std::to_string(shape.size()) + " dim(s), " + std::to_string(need) +
                    " bytes, and " + std::to_string(have) + " bytes after it", resave);
  const unsigned char* start = bytes.data() + prefix + header_len;
  if (type->dtype == 11) {
    for (uint64_t i = 0; i < need; ++i)
      if (start[i] > 1)
        return npy_fail(error, path, "a bool byte of value " + std::to_string(start[i]) +
                        " at element " + std::to_string(i), "save a real bool array");
  }
  out->dtype = type->dtype;
  out->shape = shape;
  out->data.assign(start, start + need);
  return true;
}

// Write a dense C-order tensor (host byte order, little-endian) as a version 1.0 file
// (2.0 when the header would not fit 1.0's 16-bit length).
inline bool npy_write(const std::string& path, int32_t dtype, const int64_t* shape, int32_t rank,
                      const void* data, int64_t nbytes, std::string* error) {
  const NpyType* type = npy_type_of(dtype);
  if (type == nullptr) {
    *error = "output '" + path + "' — dtype " + std::to_string(dtype) + " has no .npy type "
             "(bfloat16, complex32) — valid: the dtypes NumPy has — fix: read the raw bytes";
    return false;
  }
  std::string header = "{'descr': '";
  header += (type->itemsize == 1 ? "|" : "<");
  header += type->descr;
  header += "', 'fortran_order': False, 'shape': (";
  for (int32_t i = 0; i < rank; ++i) {
    header += std::to_string(shape[i]);
    if (rank == 1 || i + 1 < rank) header += ",";
    if (i + 1 < rank) header += " ";
  }
  header += "), }";
  bool v2 = header.size() + 12 > 65535;
  size_t prefix = v2 ? 12 : 10;
  size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');  // the data starts 64-byte aligned, as numpy's
  header += '\n';
  unsigned char head[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)(v2 ? 2 : 1), 0};
  uint64_t len = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) head[8 + i] = (unsigned char)(len >> (8 * i));
  FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(head, 1, prefix, f) == prefix &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (nbytes == 0 || std::fwrite(data, 1, (size_t)nbytes, f) == (size_t)nbytes);
  int saved = errno;
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) {
    *error = "output '" + path + "' — cannot write it (" + std::strerror(saved) +
             ") — valid: a writable folder — fix: check --output-dir and the free space";
    return false;
  }
  return true;
}

}  // namespace opforge::tools
