// The file header of a program: magic, format version, sizes, flags, and the CRC-32 of the
// metadata section (split out of reader.cpp, which decodes the metadata tables).
#include <cstring>
#include <string>

#include "reader_internal.h"

namespace opforge::rt::reader_detail {

[[noreturn]] void fail(const std::string& subject, const std::string& found,
                       const std::string& valid, const std::string& fix) {
  throw ProgramError{program_message(subject, found, valid, fix)};
}

namespace {

const uint8_t kMagic[8] = {0x89, 'O', 'P', 'F', '\r', '\n', 0x1a, '\n'};

uint32_t crc32(const uint8_t* p, size_t n) {
  static uint32_t table[256];
  static bool ready = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)ready;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace

Header check_header(const uint8_t* data, size_t size) {
  if (size == 0) {
    fail("file", "an empty file (0 bytes)", "a program file of at least 64 bytes",
         "the export did not finish; re-export the model");
  }
  if (std::memcmp(data, kMagic, size < 8 ? size : 8) != 0) {
    fail("header.magic", hex_bytes(data, size < 8 ? size : 8),
         "b'\\x89OPF\\r\\n\\x1a\\n' (an opforge program file)",
         "pass a file written by opforge.program.save()");
  }
  if (size < kHeaderSize) {
    fail("header", "a truncated file of " + std::to_string(size) + " bytes",
         "at least the 64-byte header", kReexport);
  }
  Header h;
  h.version = le32(data + 8);
  uint32_t header_size = le32(data + 12);
  uint64_t file_size = le64(data + 16);
  h.metadata_offset = le64(data + 24);
  h.metadata_size = le64(data + 32);
  uint32_t crc = le32(data + 40);
  uint32_t flags = le32(data + 44);
  h.data_offset = le64(data + 48);
  uint64_t reserved = le64(data + 56);
  if (h.version > kMaxFormatVersion || h.version < kMinFormatVersion) {
    bool newer = h.version > kMaxFormatVersion;
    fail("header.format_version", "version " + std::to_string(h.version) + (newer ? " (newer)" : ""),
         "versions 1..6", newer ? "upgrade opforge to load this file" : kReexport);
  }
  if (header_size != kHeaderSize) {
    fail("header.header_size", std::to_string(header_size), "64", kReexport);
  }
  if (flags != 0) {
    fail("header.flags", std::to_string(flags), "0 (no flags are defined in versions 1 to 6)",
         kReexport);
  }
  if (reserved != 0) fail("header.reserved", std::to_string(reserved), "0", kReexport);
  if (file_size != size) {
    fail("header.file_size", std::to_string(file_size) + " but the file has " +
                                 std::to_string(size) + " bytes " +
                                 (size < file_size ? "(truncated)" : "(trailing bytes)"),
         "the file's real length",
         "the file was cut short or appended to (an interrupted copy?); copy it again or "
         "re-export it");
  }
  if (h.metadata_offset != kHeaderSize) {
    fail("header.metadata_offset", std::to_string(h.metadata_offset),
         "64 (right after the header)", kReexport);
  }
  if (h.data_offset % kAlignment != 0 || h.data_offset < kHeaderSize || h.data_offset > file_size) {
    fail("header.data_offset", std::to_string(h.data_offset),
         "a multiple of 64 in [64, file_size=" + std::to_string(file_size) + "]", kReexport);
  }
  if (h.metadata_size > h.data_offset - h.metadata_offset) {
    fail("header.metadata_size", std::to_string(h.metadata_size),
         "at most data_offset - metadata_offset = " +
             std::to_string(h.data_offset - h.metadata_offset), kReexport);
  }
  uint32_t actual = crc32(data + h.metadata_offset, h.metadata_size);
  if (actual != crc) {
    fail("header.metadata_crc32", hex32(crc) + " but the metadata hashes to " + hex32(actual),
         "the CRC-32 of the metadata section", "the file is corrupt; copy or re-export it");
  }
  return h;
}

}  // namespace opforge::rt::reader_detail
