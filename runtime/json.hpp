// json: writing JSON values into a string (dsec writes JSON, it never parses it:
// `dsec session watch` lines, dsec-load's --json results), and the UTF-8 check
// the string writer and Chronus's text fields share.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dsec {

/// The length of the valid UTF-8 sequence at p (1..4, n > 0 bytes there), or 0
/// when the bytes are not one (overlong forms, surrogates, code points above
/// U+10FFFF, truncation).
size_t utf8_sequence(const unsigned char* p, size_t n) noexcept;

/// Appends `s` as a JSON string, quotes included: `"` and `\` escaped, \n \r \t
/// by name, other control bytes and DEL as \u00XX, valid UTF-8 passed through
/// and each byte of invalid UTF-8 as U+FFFD, so that the output is always valid
/// JSON.
void json_string(std::string& out, std::string_view s);

/// `s` as a JSON string (json_string into a new string).
std::string json_quoted(std::string_view s);

/// Appends `v` in the shortest form that reads back the same; null for a value
/// JSON cannot hold (NaN, infinity).
void json_number(std::string& out, double v);

/// Appends the bytes `s` as a JSON string of standard base64 (with padding).
void json_base64(std::string& out, std::string_view s);

} // namespace dsec
