// SPDX-License-Identifier: Apache-2.0
#include "core/text.h"

#include <cstdint>

namespace protokv::text {

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit; !from.empty() && (hit = text.find(from, pos)) != std::string_view::npos;
       pos = hit + from.size()) {
    out.append(text, pos, hit - pos);
    out.append(to);
  }
  out.append(text, pos);
  return out;
}

int utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 0;
}

int decode_utf8(std::string_view text, size_t pos, char32_t& code_point) {
  if (pos >= text.size()) return 0;
  const auto lead = static_cast<unsigned char>(text[pos]);
  const int length = utf8_sequence_length(lead);
  if (length == 0 || pos + static_cast<size_t>(length) > text.size()) return 0;
  uint32_t cp = length == 1 ? lead : lead & (0x7Fu >> length);
  for (int k = 1; k < length; ++k) {
    const auto next = static_cast<unsigned char>(text[pos + static_cast<size_t>(k)]);
    if ((next & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (next & 0x3Fu);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};  // by length
  if (cp < kSmallest[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  code_point = cp;
  return length;
}

void append_utf8(char32_t code_point, std::string& out) {
  const auto c = static_cast<uint32_t>(code_point);
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_valid_utf8(std::string_view text) {
  char32_t cp;
  for (size_t pos = 0; pos < text.size();) {
    const int length = decode_utf8(text, pos, cp);
    if (length == 0) return false;
    pos += static_cast<size_t>(length);
  }
  return true;
}

std::u32string to_code_points(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  char32_t cp;
  for (size_t pos = 0; pos < text.size();) {
    const int length = decode_utf8(text, pos, cp);
    out.push_back(length == 0 ? char32_t{0xFFFD} : cp);
    pos += static_cast<size_t>(length == 0 ? 1 : length);
  }
  return out;
}

std::string from_code_points(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) append_utf8(c, out);
  return out;
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char32_t cp;
  for (size_t pos = 0; pos < text.size();) {
    const int length = decode_utf8(text, pos, cp);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++pos;
      continue;
    }
    out.append(text, pos, static_cast<size_t>(length));
    pos += static_cast<size_t>(length);
  }
  return out;
}

}  // namespace protokv::text
