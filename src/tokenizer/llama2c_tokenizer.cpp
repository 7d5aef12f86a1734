// SPDX-License-Identifier: Apache-2.0
// llama2.c tokenizer.bin reader: int32 max_token_length, then per token: f32 score, int32 length,
// `length` bytes. Pieces there hold real spaces; we store them with "▁" like SentencePiece/GGUF.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "protokv/error.h"
#include "protokv/tokenizer.h"
#include "tokenizer/pieces.h"

namespace protokv {

namespace {

// Sequential reader that checks every read against the bytes left in the file, so a corrupt
// length can never cause a huge allocation or a read past the end.
class BoundedReader {
 public:
  explicit BoundedReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    std::error_code ec;
    const bool regular = std::filesystem::is_regular_file(path, ec);
    PROTOKV_CHECK(regular && in_, "cannot open tokenizer file {}", path);
    remaining_ = std::filesystem::file_size(path, ec);
    PROTOKV_CHECK(!ec, "cannot read size of tokenizer file {}: {}", path, ec.message());
  }

  uint64_t remaining() const { return remaining_; }

  void read(void* out, uint64_t n, std::string_view what) {
    PROTOKV_CHECK(n <= remaining_, "tokenizer file {} is truncated: {} needs {} bytes, {} left",
                  path_, what, n, remaining_);
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    PROTOKV_CHECK(in_.gcount() == static_cast<std::streamsize>(n),
                  "error reading tokenizer file {}", path_);
    remaining_ -= n;
  }

  template <typename T>
  T read_scalar(std::string_view what) {
    T value;
    read(&value, sizeof(value), what);  // little-endian host assumed, as llama2.c does
    return value;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t remaining_ = 0;
};

}  // namespace

std::shared_ptr<Tokenizer> Tokenizer::load_llama2c(const std::string& path, int vocab_size) {
  PROTOKV_CHECK(vocab_size > 0 && vocab_size <= kMaxVocabSize,
                "tokenizer vocabulary size {} out of range (1..{})", vocab_size, kMaxVocabSize);
  BoundedReader reader(path);
  const auto max_token_length = reader.read_scalar<int32_t>("the header");
  PROTOKV_CHECK(max_token_length >= 0, "tokenizer file {}: negative max_token_length {}", path,
                max_token_length);
  // Every token needs at least its score and length fields: reject a too-small file up front.
  PROTOKV_CHECK(reader.remaining() >= 8ull * static_cast<uint64_t>(vocab_size),
                "tokenizer file {} is truncated: {} tokens need at least {} bytes, {} left", path,
                vocab_size, 8ull * static_cast<uint64_t>(vocab_size), reader.remaining());

  constexpr int32_t kBos = 1, kEos = 2, kUnk = 0;
  std::vector<std::string> pieces(vocab_size);
  std::vector<float> scores(vocab_size);
  std::vector<int32_t> types(vocab_size);
  std::string raw;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const std::string what = fmt::format("token {}", i);
    scores[i] = reader.read_scalar<float>(what);
    const auto length = reader.read_scalar<int32_t>(what);
    PROTOKV_CHECK(length >= 0, "tokenizer file {}: token {} has negative length {}", path, i,
                  length);
    PROTOKV_CHECK(static_cast<uint64_t>(length) <= reader.remaining(),
                  "tokenizer file {} is truncated: token {} needs {} bytes, {} left", path, i,
                  length, reader.remaining());
    raw.resize(static_cast<size_t>(length));
    reader.read(raw.data(), raw.size(), what);
    pieces[i] = tokenizer::spaces_to_markers(raw);
    // The ids are llama2.c's fixed convention (it exports <unk>, <s>, </s> as 0, 1, 2).
    types[i] = tokenizer::infer_token_type(i, pieces[i], kBos, kEos, kUnk);
  }
  return std::make_shared<Tokenizer>(std::move(pieces), std::move(scores), std::move(types), kBos,
                                     kEos, kUnk);
}

}  // namespace protokv
