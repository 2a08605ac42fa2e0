// Memory limits, aligned buffers and the run-time form of packed constants (memory.h).
#include "memory.h"

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "errors.h"

namespace opforge::rt {

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    raise(OPF_ERR_PROGRAM, std::string("opforge runtime: ") + what + " — overflows int64 — valid: "
                           "sizes whose product fits in int64 — fix: check the program file");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    raise(OPF_ERR_PROGRAM, std::string("opforge runtime: ") + what + " — overflows int64 — valid: "
                           "sizes whose sum fits in int64 — fix: check the program file");
  return r;
}

std::string human_bytes(int64_t nbytes) {
  static const struct { const char* unit; int shift; } kUnits[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  char text[64];
  for (const auto& u : kUnits)
    if (nbytes >= (int64_t(1) << u.shift)) {
      std::snprintf(text, sizeof text, "%.1f %s", double(nbytes) / double(int64_t(1) << u.shift), u.unit);
      return text;
    }
  return std::to_string(nbytes) + " B";
}

static bool parse_size(const std::string& text, int64_t* out) {
  size_t i = 0, n = text.size();
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t digits = i;
  int64_t value = 0;
  while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, text[i] - '0', &value))
      return false;
    ++i;
  }
  if (i == digits) return false;
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  int shift = 0;
  if (i < n) {
    char c = static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
    if (c == 'K') shift = 10; else if (c == 'M') shift = 20; else if (c == 'G') shift = 30;
    else if (c == 'T') shift = 40;
    if (shift) {
      ++i;
      if (i < n && std::toupper(static_cast<unsigned char>(text[i])) == 'I') {
        ++i;
        if (i >= n || std::toupper(static_cast<unsigned char>(text[i])) != 'B') return false;
      }
      if (i < n && std::toupper(static_cast<unsigned char>(text[i])) == 'B') ++i;
    } else if (c == 'B') {
      ++i;
    }
  }
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != n) return false;
  if (shift && value > (INT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

int64_t resolve_max_memory(int64_t requested, const std::string& api) {
  if (requested > 0) return requested;
  if (requested < 0)
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + api + "`: max_memory — found " + std::to_string(requested) +
                                        " — valid: a positive number of bytes, or 0 for the default — fix: "
                                        "pass e.g. 16 << 30 for 16 GiB");
  const char* env = std::getenv("OPFORGE_MAX_MEMORY");
  std::string text = env ? env : "";
  size_t a = text.find_first_not_of(" \t\n"), b = text.find_last_not_of(" \t\n");
  text = a == std::string::npos ? "" : text.substr(a, b - a + 1);
  if (text.empty()) return kDefaultMaxMemory;
  int64_t size = 0;
  if (!parse_size(text, &size) || size <= 0)
    raise(OPF_ERR_INVALID_ARGUMENT,
          "`" + api + "`: environment variable OPFORGE_MAX_MEMORY — found '" + text +
              "' — valid: a positive number of bytes, optionally with K, M, G or T (binary: 16G = "
              "16 GiB) — fix: export OPFORGE_MAX_MEMORY=16G, or unset it for the 8 GiB default");
  return size;
}

void check_memory(const std::string& api, const std::string& subject, int64_t nbytes, int64_t limit,
                  const std::string& fix) {
  if (nbytes <= limit) return;
  raise(OPF_ERR_MEMORY,
        "`" + api + "`: " + subject + " — needs " + std::to_string(nbytes) + " bytes (" + human_bytes(nbytes) +
            ") — valid: at most the memory limit, " + std::to_string(limit) + " bytes (" + human_bytes(limit) +
            ") — fix: " +
            (fix.empty() ? "1. check that the program file is the one exported (a corrupt or hostile file asks "
                           "for absurd sizes); 2. if the model really needs it, raise the limit: "
                           "opf_load_options.max_memory or OPFORGE_MAX_MEMORY=N"
                         : fix));
}

int64_t arena_bytes(const Method& method) {
  int64_t total = 0;
  for (int64_t size : method.arena_sizes) total = checked_add(total, checked_add(size, kAlignment, "arena size"), "arena sizes");
  return total;
}

AlignedBuffer::AlignedBuffer(int64_t nbytes, const std::string& what) {
  if (nbytes < 0) raise(OPF_ERR_INTERNAL, "opforge runtime: a negative allocation for " + what);
  size_t rounded = static_cast<size_t>((nbytes + kAlignment - 1) / kAlignment * kAlignment);
  if (rounded == 0) rounded = kAlignment;
  data_ = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, rounded));
  if (data_ == nullptr)
    raise(OPF_ERR_MEMORY, "opforge runtime: " + what + " — needs " + std::to_string(nbytes) +
                              " bytes, which the system could not allocate — valid: a size that fits in free "
                              "memory — fix: free memory, or lower the memory limit so that such programs are "
                              "refused at load");
  std::memset(data_, 0, rounded);
  size_ = nbytes;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n = checked_mul(n, s, "a tensor's element count");
  return n;
}

void dense_strides(const int64_t* sizes, const uint8_t* dim_order, int32_t rank, int64_t* strides) {
  int64_t stride = 1;
  for (int32_t k = rank - 1; k >= 0; --k) {
    int32_t d = dim_order[k];
    strides[d] = stride;
    int64_t s = sizes[d] > 1 ? sizes[d] : 1;
    if (__builtin_mul_overflow(stride, s, &stride)) stride = INT64_MAX;  // sizes are checked first
  }
}

const uint8_t* ConstantForms::data(const Program& program, const TensorDef& t, int64_t limit) {
  const Segment& segment = program.segments.at(t.storage_index);
  const uint8_t* stored = segment.data + t.storage_offset;
  if (t.storage == StorageKind::Constant) return stored;
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_tuple(int(t.storage), t.storage_index, t.storage_offset, numel_of(t.sizes), t.dtype);
  auto it = forms_.find(key);
  if (it != forms_.end()) return it->second.data();
  int64_t itemsize = itemsize_of(t.dtype);
  int64_t numel = std::get<3>(key);
  int64_t nbytes = checked_mul(numel, itemsize, "a constant's bytes");
  check_memory("opf_method_new", "the program's unpacked constants", checked_add(nbytes_, nbytes, "constants"),
               limit);
  AlignedBuffer buffer(nbytes, "an unpacked constant");
  uint8_t* out = buffer.data();
  if (t.storage == StorageKind::ConstantInt4) {
    // element 2i is the low nibble of byte i, 2i + 1 the high one; two's complement
    for (int64_t i = 0; i < numel; ++i) {
      uint8_t byte = stored[i / 2];
      int v = (i & 1) ? (byte >> 4) : (byte & 0xF);
      out[i] = static_cast<uint8_t>(static_cast<int8_t>(v >= 8 ? v - 16 : v));
    }
  } else if (t.storage == StorageKind::ConstantSplat) {
    for (int64_t i = 0; i < numel; ++i) std::memcpy(out + i * itemsize, stored, static_cast<size_t>(itemsize));
  } else {
    raise(OPF_ERR_INTERNAL, "opforge runtime: a constant of an unknown storage kind");
  }
  nbytes_ += nbytes;
  return forms_.emplace(key, std::move(buffer)).first->second.data();
}

}  // namespace opforge::rt
