// SPDX-License-Identifier: Apache-2.0
// The tokenizer as GGUF metadata (`tokenizer.ggml.*`): llama.cpp's "llama" (SentencePiece) and
// "gpt2" (byte-level BPE) models. Kept apart from the encoders so that code using only the
// tokenizer does not link the GGUF I/O.
#include <cstring>
#include <fstream>

#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/impl.h"
#include "tokenizer/pieces.h"

namespace protokv {

std::shared_ptr<Tokenizer> make_tokenizer(std::unique_ptr<Tokenizer::Impl> impl);

namespace {

int32_t special_token_id(const GgufFile& file, const std::string& key, int32_t fallback,
                         size_t vocab_size) {
  const int64_t id = file.get_int(key).value_or(fallback);
  if (id == -1 && fallback == -1) return -1;
  PROTOKV_CHECK(id >= 0 && static_cast<uint64_t>(id) < vocab_size,
                "GGUF {} = {} out of range (vocabulary size {})", key, id, vocab_size);
  return static_cast<int32_t>(id);
}

}  // namespace

std::shared_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  const auto model = file.get_string("tokenizer.ggml.model");
  PROTOKV_CHECK(model.has_value(), "GGUF file has no tokenizer (tokenizer.ggml.model missing)");
  PROTOKV_CHECK(*model == "llama" || *model == "gpt2",
                "unsupported tokenizer model '{}' (supported: llama, gpt2)", *model);
  const bool spm = *model == "llama";

  auto impl = std::make_unique<Impl>();
  impl->llama_cpp_rules = true;
  impl->model = spm ? Model::kSentencePiece : Model::kByteLevelBpe;
  auto pieces = file.get_string_array("tokenizer.ggml.tokens");
  PROTOKV_CHECK(pieces.has_value(), "GGUF tokenizer has no tokenizer.ggml.tokens");
  const size_t n = pieces->size();
  PROTOKV_CHECK(n > 0 && n <= static_cast<size_t>(kMaxVocabSize),
                "GGUF tokenizer.ggml.tokens has {} entries (expected 1..{})", n, kMaxVocabSize);
  impl->pieces = std::move(*pieces);

  impl->bos_id = special_token_id(file, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
  impl->eos_id = special_token_id(file, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
  impl->unk_id = special_token_id(file, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
  impl->add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  impl->add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(spm);
  impl->chat_template = file.get_string("tokenizer.chat_template").value_or("");

  impl->scores.assign(n, 0.0f);
  if (const auto stored = file.get_float_array("tokenizer.ggml.scores")) {
    PROTOKV_CHECK(stored->size() == n, "GGUF tokenizer.ggml.scores has {} entries, tokens has {}",
                  stored->size(), n);
    for (size_t i = 0; i < n; ++i) impl->scores[i] = static_cast<float>((*stored)[i]);
  }

  impl->types.resize(n);
  if (const auto stored = file.get_int_array("tokenizer.ggml.token_type")) {
    PROTOKV_CHECK(stored->size() == n,
                  "GGUF tokenizer.ggml.token_type has {} entries, tokens has {}", stored->size(),
                  n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t type = (*stored)[i];
      PROTOKV_CHECK(type >= kUndefined && type <= kByte,
                    "GGUF tokenizer.ggml.token_type[{}] = {} is not a token type", i, type);
      impl->types[i] = static_cast<int32_t>(type);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      impl->types[i] = spm ? tokenizer::infer_token_type(static_cast<int32_t>(i), impl->pieces[i],
                                                         impl->bos_id, impl->eos_id, impl->unk_id)
                           : static_cast<int32_t>(kNormal);
    }
  }

  if (!spm) {
    auto merges = file.get_string_array("tokenizer.ggml.merges");
    PROTOKV_CHECK(merges.has_value() && !merges->empty(),
                  "GGUF gpt2 tokenizer has no tokenizer.ggml.merges");
    impl->merges = std::move(*merges);
    impl->pre_tokenizer_name = file.get_string("tokenizer.ggml.pre").value_or("default");
    impl->pre_regexes =
        tokenizer::pre_tokenizer_regexes(impl->pre_tokenizer_name, impl->ignore_merges);
  }
  return make_tokenizer(std::move(impl));
}

void Tokenizer::write_gguf(GgufWriter& writer) const {
  const Impl& t = *impl_;
  const bool spm = t.model == Model::kSentencePiece;
  writer.set_string("tokenizer.ggml.model", spm ? "llama" : "gpt2");
  writer.set_string_array("tokenizer.ggml.tokens", t.pieces);
  if (spm) {
    writer.set_f32_array("tokenizer.ggml.scores", t.scores);
    if (!t.add_space_prefix) writer.set_bool("tokenizer.ggml.add_space_prefix", false);
  } else {
    const std::string pre = t.pre_tokenizer_name.empty()
                                ? tokenizer::pre_tokenizer_name_for(t.pre_regexes)
                                : t.pre_tokenizer_name;
    PROTOKV_CHECK(!pre.empty(),
                  "this tokenizer's pre-tokenizer regex has no GGUF tokenizer.ggml.pre name");
    writer.set_string("tokenizer.ggml.pre", pre);
    writer.set_string_array("tokenizer.ggml.merges", t.merges);
  }
  writer.set_i32_array("tokenizer.ggml.token_type", t.types);
  if (t.bos_id >= 0) writer.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(t.bos_id));
  if (t.eos_id >= 0) writer.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(t.eos_id));
  if (t.unk_id >= 0) {
    writer.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(t.unk_id));
  }
  writer.set_bool("tokenizer.ggml.add_bos_token", t.add_bos);
  writer.set_bool("tokenizer.ggml.add_eos_token", false);
  if (!t.chat_template.empty()) writer.set_string("tokenizer.chat_template", t.chat_template);
}

std::shared_ptr<Tokenizer> Tokenizer::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot open tokenizer file {}", path);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) {
    return from_gguf(GgufFile::open(path));
  }
  return from_hf_json(path);
}

}  // namespace protokv
