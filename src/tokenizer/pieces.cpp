// SPDX-License-Identifier: Apache-2.0
#include "tokenizer/pieces.h"

#include "core/text.h"
#include "protokv/tokenizer.h"

namespace protokv::tokenizer {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string spaces_to_markers(std::string_view text) {
  return text::replace_all(text, " ", kSpaceMarker);
}

std::string markers_to_spaces(std::string_view piece) {
  return text::replace_all(piece, kSpaceMarker, " ");
}

std::string normalize_for_encoding(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4 + kSpaceMarker.size());
  out.append(kSpaceMarker);
  for (const char c : text) {
    if (c == ' ') {
      out.append(kSpaceMarker);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool has_marker_after_other_char(std::string_view piece) {
  for (size_t pos = piece.find(kSpaceMarker, 1); pos != std::string_view::npos;
       pos = piece.find(kSpaceMarker, pos + 1)) {
    if (pos < kSpaceMarker.size() ||
        piece.compare(pos - kSpaceMarker.size(), kSpaceMarker.size(), kSpaceMarker) != 0) {
      return true;
    }
  }
  return false;
}

int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  const int high = hex_digit(piece[3]);
  const int low = hex_digit(piece[4]);
  if (high < 0 || low < 0) return -1;
  return high * 16 + low;
}

size_t utf8_char_length(std::string_view text, size_t pos) {
  size_t length = 1;
  while (length < 4 && pos + length < text.size() &&
         (static_cast<uint8_t>(text[pos + length]) & 0xC0u) == 0x80u) {
    ++length;
  }
  return length;
}

int32_t infer_token_type(int32_t id, std::string_view piece, int32_t bos_id, int32_t eos_id,
                         int32_t unk_id) {
  if (id == unk_id) return Tokenizer::kUnknown;
  if (id == bos_id || id == eos_id) return Tokenizer::kControl;
  if (parse_byte_piece(piece) >= 0) return Tokenizer::kByte;
  return Tokenizer::kNormal;
}

}  // namespace protokv::tokenizer
