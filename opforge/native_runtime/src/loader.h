// Loading: the bytes of a program file (a read-only memory map of a path or fd, or the
// caller's buffer, used in place or copied) and the load pipeline that turns them into an
// opf_program:
//
//   bytes → read_program (decode + verify) → memory limit of every
//   method's arenas → resolve every KernelCall in the registry (all missing listed at
//   once) → refuse a constant where a kernel writes → live state → the delegates
//   (backend.h: each DelegateCall's delegate initialised by its backend)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "opforge/runtime.h"

namespace opforge::rt {

// The program file's bytes, owned or borrowed. Mapped files keep their fd open while
// mapped (a path's own fd; a caller's fd is dup()ed).
class FileBytes {
 public:
  static std::unique_ptr<FileBytes> map_path(const std::string& path);
  static std::unique_ptr<FileBytes> map_fd(int fd, const std::string& label);
  static std::unique_ptr<FileBytes> borrow(const void* data, size_t size);
  static std::unique_ptr<FileBytes> copy(const void* data, size_t size);
  // A read-only mapping of `size` bytes and the fd it came from (both released here).
  static std::unique_ptr<FileBytes> adopt_map(void* map, size_t size, int fd);
  ~FileBytes();
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // a read-only mapping of the file: pages dropped with MADV_DONTNEED fault in again unchanged
  bool mapped() const { return map_ != nullptr; }
  // the file the mapping came from, open until destruction (-1: not a mapping)
  int fd() const { return map_ != nullptr ? fd_ : -1; }

 private:
  FileBytes() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;      // munmap at destruction
  size_t map_size_ = 0;
  int fd_ = -1;              // closed at destruction
  void* owned_ = nullptr;    // free() at destruction (a copy)
};

// The whole load: never returns a half-made program (throws Error / ProgramError).
opf_program* load_program(std::unique_ptr<FileBytes> bytes, const std::string& label,
                          const opf_registry* registry, const opf_load_options* options);

}  // namespace opforge::rt
