// The tokenizer as GGUF metadata (`tokenizer.ggml.*`, llama.cpp's "llama" = SentencePiece model).
// Kept apart from the encoder so that code using only the tokenizer does not link the GGUF I/O.
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "tokenizer/pieces.h"

namespace protokv {

namespace {

int32_t special_token_id(const GgufFile& file, const std::string& key, int32_t fallback,
                         size_t vocab_size) {
  const int64_t id = file.get_int(key).value_or(fallback);
  PROTOKV_CHECK(id >= 0 && static_cast<uint64_t>(id) < vocab_size,
                "GGUF {} = {} out of range (vocabulary size {})", key, id, vocab_size);
  return static_cast<int32_t>(id);
}

}  // namespace

std::shared_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  const auto model = file.get_string("tokenizer.ggml.model");
  PROTOKV_CHECK(model.has_value(), "GGUF file has no tokenizer (tokenizer.ggml.model missing)");
  PROTOKV_CHECK(*model == "llama", "unsupported tokenizer model {}", *model);

  auto pieces = file.get_string_array("tokenizer.ggml.tokens");
  PROTOKV_CHECK(pieces.has_value(), "GGUF tokenizer has no tokenizer.ggml.tokens");
  const size_t n = pieces->size();
  PROTOKV_CHECK(n > 0 && n <= static_cast<size_t>(kMaxVocabSize),
                "GGUF tokenizer.ggml.tokens has {} entries (expected 1..{})", n, kMaxVocabSize);

  const int32_t bos = special_token_id(file, "tokenizer.ggml.bos_token_id", 1, n);
  const int32_t eos = special_token_id(file, "tokenizer.ggml.eos_token_id", 2, n);
  const int32_t unk = special_token_id(file, "tokenizer.ggml.unknown_token_id", 0, n);

  std::vector<float> scores(n, 0.0f);
  if (const auto stored = file.get_float_array("tokenizer.ggml.scores")) {
    PROTOKV_CHECK(stored->size() == n, "GGUF tokenizer.ggml.scores has {} entries, tokens has {}",
                  stored->size(), n);
    for (size_t i = 0; i < n; ++i) scores[i] = static_cast<float>((*stored)[i]);
  }

  std::vector<int32_t> types(n);
  if (const auto stored = file.get_int_array("tokenizer.ggml.token_type")) {
    PROTOKV_CHECK(stored->size() == n,
                  "GGUF tokenizer.ggml.token_type has {} entries, tokens has {}", stored->size(),
                  n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t type = (*stored)[i];
      PROTOKV_CHECK(type >= kUndefined && type <= kByte,
                    "GGUF tokenizer.ggml.token_type[{}] = {} is not a token type", i, type);
      types[i] = static_cast<int32_t>(type);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      types[i] = tokenizer::infer_token_type(static_cast<int32_t>(i), (*pieces)[i], bos, eos, unk);
    }
  }
  return std::make_shared<Tokenizer>(std::move(*pieces), std::move(scores), std::move(types), bos,
                                     eos, unk);
}

void Tokenizer::write_gguf(GgufWriter& writer) const {
  writer.set_string("tokenizer.ggml.model", "llama");
  writer.set_string_array("tokenizer.ggml.tokens", pieces_);
  writer.set_f32_array("tokenizer.ggml.scores", scores_);
  writer.set_i32_array("tokenizer.ggml.token_type", types_);
  writer.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos_id_));
  writer.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos_id_));
  writer.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(unk_id_));
  writer.set_bool("tokenizer.ggml.add_bos_token", true);
  writer.set_bool("tokenizer.ggml.add_eos_token", false);
}

}  // namespace protokv
