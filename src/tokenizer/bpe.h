// SPDX-License-Identifier: Apache-2.0
#pragma once
// Byte-level BPE (GPT-2 family): byte <-> unicode map, regex pre-tokenizer (ICU), merge ranks.
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/impl.h"

namespace protokv::tokenizer {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 + k.
// Returns the UTF-8 text of `bytes` in that alphabet.
std::string byte_level_encode(std::string_view bytes);
// The inverse; characters outside the alphabet are copied unchanged.
std::string byte_level_decode(std::string_view text);

// The pre-tokenizer regexes llama.cpp uses for GGUF tokenizer.ggml.pre `name` (llama-vocab.cpp);
// sets `ignore_merges` for Llama 3. Throws Error for an unknown name.
std::vector<std::string> pre_tokenizer_regexes(std::string_view name, bool& ignore_merges);
// The GGUF pre-tokenizer name whose regexes are exactly `regexes` (for writing GGUF), or "".
std::string pre_tokenizer_name_for(const std::vector<std::string>& regexes);

class BytePairEncoder {
 public:
  // Compiles the regexes and the merge table of `t` (its pieces, merges, flags). Throws Error.
  explicit BytePairEncoder(const protokv::Tokenizer::Impl& t);
  ~BytePairEncoder();
  BytePairEncoder(const BytePairEncoder&) = delete;
  BytePairEncoder& operator=(const BytePairEncoder&) = delete;

  void encode(const protokv::Tokenizer::Impl& t, std::string_view text,
              std::vector<int32_t>& out) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  // key: left id << 32 | right id
  std::unordered_map<uint64_t, Merge> merges_;
  // Splits text[begin, end) into the words of all regexes, in order.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words) const;
  void encode_word(const protokv::Tokenizer::Impl& t, std::string_view word,
                   std::vector<int32_t>& out) const;
};

}  // namespace protokv::tokenizer
