// SPDX-License-Identifier: Apache-2.0
#pragma once
// Piece-string conventions shared by the tokenizer's loaders, encoder and decoder.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace protokv::tokenizer {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's stand-in for a space inside pieces.
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

std::string spaces_to_markers(std::string_view text);
std::string markers_to_spaces(std::string_view piece);

// SentencePiece normalisation as llama2.c applies it: a dummy-prefix space, then every space
// becomes kSpaceMarker. `text` must be non-empty.
std::string normalize_for_encoding(std::string_view text);

// Whether `piece` holds a space marker right after a byte that is not the end of another marker
// ("a▁b" does; "▁▁a" does not). A piece like that could span the start of a word.
bool has_marker_after_other_char(std::string_view piece);

// 64-bit FNV-1a: pieces are short, so a byte loop beats heavier hashes.
inline uint64_t hash_bytes(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The byte of a "<0xHH>" piece (either hex case), or -1 when `piece` has another form.
int parse_byte_piece(std::string_view piece);

// Length of the UTF-8 character starting at `pos`, grouped as llama2.c does: the byte at `pos`
// plus up to three following continuation bytes (so invalid UTF-8 still splits into units).
size_t utf8_char_length(std::string_view text, size_t pos);

// Token type of a vocabulary without explicit types (llama2.c tokenizer.bin, GGUF without
// tokenizer.ggml.token_type): unk -> kUnknown, BOS/EOS -> kControl, "<0xHH>" -> kByte, else
// kNormal. Returns a Tokenizer::TokenType value.
int32_t infer_token_type(int32_t id, std::string_view piece, int32_t bos_id, int32_t eos_id,
                         int32_t unk_id);

}  // namespace protokv::tokenizer
