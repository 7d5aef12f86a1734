#pragma once
// SentencePiece-style BPE over scored pieces (llama/mistral): the same vocabulary read from a
// llama2.c tokenizer.bin or from GGUF `tokenizer.ggml.*` metadata.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace protokv {

class GgufFile;
class GgufWriter;

class Tokenizer {
 public:
  // GGUF token types. Only kNormal and kUserDefined pieces are matched against text; kByte
  // pieces ("<0xHH>") are the byte fallback; the others decode to "".
  enum TokenType : int32_t {
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };
  static constexpr int32_t kMaxVocabSize = 1 << 22;

  // pieces use U+2581 ("▁") for spaces, as SentencePiece and GGUF do.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
            int32_t bos_id, int32_t eos_id, int32_t unk_id);

  // llama2.c tokenizer.bin (int32 max_token_length; per token: f32 score, int32 len, bytes).
  static std::shared_ptr<Tokenizer> load_llama2c(const std::string& path, int vocab_size);
  // GGUF tokenizer.ggml.model == "llama"; throws Error for other models or bad metadata.
  static std::shared_ptr<Tokenizer> from_gguf(const GgufFile& file);
  // Writes tokenizer.ggml.* keys.
  void write_gguf(GgufWriter& writer) const;

  // SentencePiece encoding with the dummy-prefix space (text non-empty), byte fallback.
  // Normalisation is llama2.c's: spaces -> "▁" only (no NFKC, no collapsing of repeated spaces
  // as SentencePiece's remove_extra_whitespaces does). Approximation: user-defined pieces take
  // part in BPE like normal pieces (SentencePiece matches them whole, before BPE).
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  // Text of `token` following `prev` (the leading space after BOS is dropped; <0xXX> -> byte).
  // `prev` is only compared with BOS (pass -1 for "no previous token"); `token` out of range
  // throws Error.
  std::string decode(int32_t prev, int32_t token) const;
  std::string decode(std::span<const int32_t> tokens) const;  // tokens may start with BOS

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t unk_id() const { return unk_id_; }
  const std::vector<std::string>& pieces() const { return pieces_; }
  const std::vector<float>& scores() const { return scores_; }
  const std::vector<int32_t>& types() const { return types_; }

 private:
  struct EncodeScratch;
  // BPE over one span of normalised text, appending its ids to `out`.
  void encode_segment(std::string_view segment, EncodeScratch& scratch,
                      std::vector<int32_t>& out) const;
  // Id of the matchable (normal / user-defined) piece equal to `text`, or -1.
  int32_t find_piece(std::string_view text) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  int32_t bos_id_, eos_id_, unk_id_;
  // Open-addressing hash table of the matchable pieces (linear probing, power-of-two size):
  // lookups by string_view without building a std::string, the encoder's hottest operation.
  struct PieceSlot {
    uint64_t hash = 0;
    int32_t id = -1;  // -1: empty
  };
  std::vector<PieceSlot> piece_slots_;
  int32_t byte_tokens_[256];
  std::vector<std::string> texts_;  // decoded text of each token ("▁" -> ' ', <0xHH> -> byte)
  size_t max_piece_bytes_ = 0;      // longest matchable piece: longer spans are never looked up
  // True when no piece contains "▁" right after another character than "▁": then no merge can
  // cross the start of a word, and words are encoded one at a time (exactly the same result,
  // with small, cache-resident merge queues).
  bool words_are_independent_ = true;
};

}  // namespace protokv
