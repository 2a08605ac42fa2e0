// Memory: the limit one method instance may allocate (opforge/runtime/limits.py), planned
// arenas (64-byte aligned, zero-filled, or the caller's), and the constants a program
// turns into their run-time form once (int4 unpacked, splat expanded), shared read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "opforge/runtime.h"
#include "program.h"
#include "program_text.h"  // itemsize_of, dtype_name

namespace opforge::rt {

constexpr int64_t kAlignment = 64;
constexpr int64_t kDefaultMaxMemory = int64_t(8) << 30;

// The limit: `requested` if > 0, else OPFORGE_MAX_MEMORY ("123", "512M", "16G", "16GiB"),
// else 8 GiB. A malformed environment value is OPF_ERR_INVALID_ARGUMENT.
int64_t resolve_max_memory(int64_t requested, const std::string& api);
// Error OPF_ERR_MEMORY unless nbytes <= limit (the message of limits.check_memory).
void check_memory(const std::string& api, const std::string& subject, int64_t nbytes,
                  int64_t limit, const std::string& fix = "");
std::string human_bytes(int64_t nbytes);
// What a method's arenas cost: their sizes plus 64 bytes of alignment slack each.
int64_t arena_bytes(const Method& method);

// Checked int64 arithmetic (sizes and offsets come from files and callers).
int64_t checked_mul(int64_t a, int64_t b, const char* what);
int64_t checked_add(int64_t a, int64_t b, const char* what);

// A zero-filled, 64-byte aligned block (OPF_ERR_MEMORY when the system refuses it).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(int64_t nbytes, const std::string& what);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

int64_t numel_of(const std::vector<int64_t>& sizes);
// Strides in elements of a tensor dense in `dim_order` at `sizes`.
void dense_strides(const int64_t* sizes, const uint8_t* dim_order, int32_t rank, int64_t* strides);

// Constants that need a run-time form: an int4-packed one unpacked to int8 (dense in its
// dim order), a splat expanded. Made once per program and tensor, shared by every method
// instance, never written.
class ConstantForms {
 public:
  // The bytes a kernel reads for constant tensor `t` (unpacked or expanded when needed).
  const uint8_t* data(const Program& program, const TensorDef& t, int64_t limit);
  int64_t nbytes() const { return nbytes_; }

 private:
  std::mutex mutex_;
  std::map<std::tuple<int, uint32_t, int64_t, int64_t, int32_t>, AlignedBuffer> forms_;
  int64_t nbytes_ = 0;
};

}  // namespace opforge::rt
