// Text helpers of the program reader and verifier: opforge's message shape, UTF-8 checks
// that match Python's strict decoder, identifiers, and the dtype table of scalar_type.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace opforge::rt {

// "subject — found F — valid: V — fix: X" (opforge/program/_errors.py).
std::string program_message(const std::string& subject, const std::string& found,
                            const std::string& valid, const std::string& fix = "");

// Python's strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
// *bad is the offset of the first invalid byte.
bool valid_utf8(const std::string& s, size_t* bad);
// Code points in valid UTF-8 (what len() of the decoded str is).
size_t utf8_length(const std::string& s);
// str.isprintable() of valid UTF-8 (CPython 3.11's table).
bool is_printable_utf8(const std::string& s);

// Python's repr of a str, shortened: 'name' with non-printable bytes escaped.
std::string quoted(const std::string& s);
std::string hex_bytes(const uint8_t* p, size_t n);
std::string hex32(uint32_t v);

bool is_ident_char(char c);
bool is_identifier(const std::string& s);         // [A-Za-z_][A-Za-z0-9_]*
bool is_operator_name(const std::string& s);      // ident::ident

// The itemsize of c10::ScalarType number `dtype`; 0 for a number opforge does not know.
int64_t itemsize_of(int dtype);
std::string dtype_name(int dtype);
extern const char* const kDtypeList;

}  // namespace opforge::rt
