// SPDX-License-Identifier: Apache-2.0
#pragma once
// Text helpers every layer shares: substitution and UTF-8 (decoding strictly, as Python's
// decoder does: a truncated or overlong sequence, a surrogate or a code point above U+10FFFF is
// not a character).
#include <cstddef>
#include <string>
#include <string_view>

namespace protokv::text {

// `text` with every occurrence of `from` (not empty) replaced by `to`, left to right, without
// rescanning what was inserted.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

// Bytes in the UTF-8 sequence that `lead` starts: 1 to 4; 0 for a continuation byte (10xxxxxx)
// or a byte no sequence starts with (0xF8 and above).
int utf8_sequence_length(unsigned char lead);

// The character at text[pos]: its length in bytes (1 to 4) with its code point in `code_point`,
// or 0 when the bytes there do not form a well-formed UTF-8 character.
int decode_utf8(std::string_view text, size_t pos, char32_t& code_point);

// Appends the UTF-8 encoding of `code_point` (at most U+10FFFF) to `out`.
void append_utf8(char32_t code_point, std::string& out);

bool is_valid_utf8(std::string_view text);

// UTF-8 to code points (Python str semantics): each byte that does not start a well-formed
// character gives U+FFFD. And back.
std::u32string to_code_points(std::string_view text);
std::string from_code_points(std::u32string_view code_points);

// `text` with every byte that does not start a well-formed character replaced by U+FFFD (as
// Python's errors="replace" does for a single bad byte; an ill-formed sequence gives one U+FFFD
// per byte).
std::string sanitize_utf8(std::string_view text);

}  // namespace protokv::text
