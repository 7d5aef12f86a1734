// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internal state of protokv::Tokenizer, shared by its loaders and the two encoders.
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protokv/tokenizer.h"

namespace protokv::tokenizer {

// Open-addressing hash table (linear probing, power-of-two size) over a vector of pieces:
// lookups by string_view without building a std::string, the encoders' hottest operation.
class PieceIndex {
 public:
  // Indexes pieces[i] for every i with include[i]; on duplicates the first (or last) id wins.
  void build(const std::vector<std::string>& pieces, const std::vector<bool>& include,
             bool last_duplicate_wins);
  int32_t find(std::string_view text) const;  // -1 when absent

 private:
  struct Slot {
    uint64_t hash = 0;
    int32_t id = -1;  // -1: empty
  };
  const std::vector<std::string>* pieces_ = nullptr;
  std::vector<Slot> slots_;
};

// Byte-level BPE (GPT-2): merge ranks and the regex pre-tokenizer. Defined in bpe.cpp.
class BytePairEncoder;

}  // namespace protokv::tokenizer

namespace protokv {

struct Tokenizer::Impl {
  Model model = Model::kSentencePiece;
  // llama2.c-compatible SentencePiece encoding (see the public constructor).
  bool llama2c_compat = false;
  // A GGUF vocabulary, loaded with llama.cpp's rules (llama-vocab.cpp): end-of-generation texts
  // become control tokens whatever their stored type. tokenizer.json keeps Hugging Face's types.
  bool llama_cpp_rules = false;
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool add_bos = true;
  bool add_space_prefix = true;  // SentencePiece dummy prefix (tokenizer.ggml.add_space_prefix)
  std::string chat_template;
  std::vector<int32_t> end_of_generation;

  // Byte-level BPE only.
  std::vector<std::string> merges;       // "left right", rank order
  std::string pre_tokenizer_name;        // GGUF tokenizer.ggml.pre ("" when not known)
  std::vector<std::string> pre_regexes;  // applied in order, each splitting the previous pieces
  bool nfc_normalize = false;            // HF normalizer "NFC"
  bool ignore_merges = false;            // a word that is a whole token skips BPE (Llama 3)
  std::shared_ptr<const tokenizer::BytePairEncoder> bpe;

  // Derived by finish().
  tokenizer::PieceIndex index;
  std::vector<std::string> texts;       // decoded bytes of each token
  std::vector<int32_t> special_tokens;  // matched whole in text, longest first
  std::array<int32_t, 256> byte_tokens{};
  size_t max_piece_bytes = 0;
  // SentencePiece: no indexed piece holds "▁" after another character, so no merge can cross
  // the start of a word and words are encoded one at a time (same result, small merge queues).
  bool words_are_independent = true;

  // Validates the fields above and builds the derived tables. Throws Error.
  void finish();

  // One run of text without special tokens, appended to `out`.
  void encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
};

}  // namespace protokv
