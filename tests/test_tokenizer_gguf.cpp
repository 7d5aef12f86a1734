// SPDX-License-Identifier: Apache-2.0
// The tokenizer as GGUF metadata: write_gguf -> GgufWriter::write -> GgufFile::open -> from_gguf.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;

// <unk>, <s>, </s>, 256 byte pieces, a few scored pieces, and one user-defined piece.
Tokenizer small_tokenizer() {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {Tokenizer::kUnknown, Tokenizer::kControl, Tokenizer::kControl};
  for (int b = 0; b < 256; ++b) {
    pieces.push_back(fmt::format("<0x{:02X}>", b));
    scores.push_back(0);
    types.push_back(Tokenizer::kByte);
  }
  const std::vector<std::pair<std::string, float>> normal = {{"\xE2\x96\x81", -10},
                                                             {"a", -11},
                                                             {"b", -12},
                                                             {"ab", -1.5f},
                                                             {"\xE2\x96\x81"
                                                              "ab",
                                                              -2.25f}};
  for (const auto& [piece, score] : normal) {
    pieces.push_back(piece);
    scores.push_back(score);
    types.push_back(Tokenizer::kNormal);
  }
  pieces.push_back("<sep>");
  scores.push_back(0);
  types.push_back(Tokenizer::kUserDefined);
  return Tokenizer(pieces, scores, types, 1, 2, 0);
}

void expect_same(const Tokenizer& a, const Tokenizer& b) {
  EXPECT_EQ(a.pieces(), b.pieces());
  EXPECT_EQ(a.scores(), b.scores());
  EXPECT_EQ(a.types(), b.types());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  EXPECT_EQ(a.unk_id(), b.unk_id());
}

TEST(TokenizerGguf, RoundTripsThroughAFile) {
  const Tokenizer original = small_tokenizer();
  TempDir dir;
  const std::string path = (dir / "tok.gguf").string();
  GgufWriter writer;
  original.write_gguf(writer);
  writer.write(path);

  const GgufFile file = GgufFile::open(path);
  EXPECT_EQ(file.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(file.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(file.get_bool("tokenizer.ggml.add_eos_token"), false);
  const auto loaded = Tokenizer::from_gguf(file);
  expect_same(original, *loaded);
  EXPECT_EQ(loaded->encode("ab ab", true), original.encode("ab ab", true));
}

TEST(TokenizerGguf, RoundTripsTok512) {
  PROTOKV_REQUIRE_STORIES();
  const auto original =
      Tokenizer::load_llama2c((testing::stories_dir() / "tok512.bin").string(), 512);
  TempDir dir;
  const std::string path = (dir / "tok.gguf").string();
  GgufWriter writer;
  original->write_gguf(writer);
  writer.write(path);
  const auto loaded = Tokenizer::from_gguf(GgufFile::open(path));
  expect_same(*original, *loaded);
}

TEST(TokenizerGguf, DefaultsWhenOptionalKeysAreAbsent) {
  const Tokenizer original = small_tokenizer();
  TempDir dir;
  const std::string path = (dir / "tok.gguf").string();
  GgufWriter writer;
  writer.set_string("tokenizer.ggml.model", "llama");
  writer.set_string_array("tokenizer.ggml.tokens", original.pieces());
  writer.write(path);
  const auto loaded = Tokenizer::from_gguf(GgufFile::open(path));
  EXPECT_EQ(loaded->pieces(), original.pieces());
  EXPECT_EQ(loaded->scores(), std::vector<float>(original.pieces().size(), 0.0f));
  EXPECT_EQ(loaded->bos_id(), 1);
  EXPECT_EQ(loaded->eos_id(), 2);
  EXPECT_EQ(loaded->unk_id(), 0);
  // Types inferred as for llama2.c files; "<sep>" (user-defined above) is inferred normal.
  std::vector<int32_t> expected_types = original.types();
  expected_types.back() = Tokenizer::kNormal;
  EXPECT_EQ(loaded->types(), expected_types);
}

TEST(TokenizerGguf, RejectsBadMetadata) {
  const Tokenizer original = small_tokenizer();
  const size_t n = original.pieces().size();
  TempDir dir;
  const std::string path = (dir / "tok.gguf").string();
  // Writes a file with the full tokenizer, then lets `edit` override keys.
  auto load_with = [&](const std::function<void(GgufWriter&)>& edit) {
    GgufWriter writer;
    edit(writer);
    writer.write(path);
    return Tokenizer::from_gguf(GgufFile::open(path));
  };
  auto full = [&](GgufWriter& w) { original.write_gguf(w); };
  EXPECT_NO_THROW(load_with(full));

  // Each bad file gives one error naming the problem.
  auto expect_error = [&](const std::function<void(GgufWriter&)>& edit, const std::string& text) {
    try {
      load_with(edit);
      ADD_FAILURE() << "expected an Error mentioning '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&](GgufWriter& w) {
        w.set_string("tokenizer.ggml.model", "bert");
        w.set_string_array("tokenizer.ggml.tokens", original.pieces());
      },
      "unsupported tokenizer model 'bert'");
  // Byte-level BPE needs merges and a known pre-tokenizer.
  expect_error(
      [&](GgufWriter& w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
      },
      "has no tokenizer.ggml.merges");
  expect_error(
      [&](GgufWriter& w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string("tokenizer.ggml.pre", "no-such-pre");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
        w.set_string_array("tokenizer.ggml.merges", {"a b"});
      },
      "unknown pre-tokenizer 'no-such-pre'");
  expect_error(
      [&](GgufWriter& w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
        w.set_string_array("tokenizer.ggml.merges", {"ab"});
      },
      "is not two tokens separated by a space");
  EXPECT_THROW(load_with([](GgufWriter&) {}), Error);  // no tokenizer at all
  EXPECT_THROW(load_with([](GgufWriter& w) { w.set_string("tokenizer.ggml.model", "llama"); }),
               Error);  // no tokens
  auto with_tokens = [&](GgufWriter& w) {
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", original.pieces());
  };
  EXPECT_THROW(load_with([&](GgufWriter& w) {
                 with_tokens(w);
                 w.set_f32_array("tokenizer.ggml.scores", {1.0f, 2.0f});
               }),
               Error);
  EXPECT_THROW(load_with([&](GgufWriter& w) {
                 with_tokens(w);
                 w.set_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(n - 1, 1));
               }),
               Error);
  EXPECT_THROW(load_with([&](GgufWriter& w) {
                 with_tokens(w);
                 w.set_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(n, 42));
               }),
               Error);
  EXPECT_THROW(load_with([&](GgufWriter& w) {
                 with_tokens(w);
                 w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(n));
               }),
               Error);
  EXPECT_THROW(load_with([&](GgufWriter& w) {
                 with_tokens(w);
                 w.set_i32("tokenizer.ggml.eos_token_id", -1);
               }),
               Error);
  EXPECT_THROW(load_with([&](GgufWriter& w) {
                 with_tokens(w);
                 w.set_string("tokenizer.ggml.unknown_token_id", "zero");  // wrong type
               }),
               Error);
}

// llama.cpp forces end-of-generation texts to control type whatever the file says (Gemma 3 stores
// "</s>" as user-defined): plain text keeps them as characters, generation stops on them.
TEST(TokenizerGguf, EndOfGenerationTextsAreControlTokensAsInLlamaCpp) {
  const Tokenizer base = small_tokenizer();
  std::vector<std::string> pieces = base.pieces();
  std::vector<int32_t> types = base.types();
  pieces[2] = "<eos>";  // the EOS id, so "</s>" below is only an end-of-generation text
  pieces.push_back("</s>");
  types.push_back(Tokenizer::kUserDefined);
  const auto end_of_text = static_cast<int32_t>(pieces.size() - 1);
  TempDir dir;
  const std::string path = (dir / "tok.gguf").string();
  GgufWriter writer;
  writer.set_string("tokenizer.ggml.model", "llama");
  writer.set_string_array("tokenizer.ggml.tokens", pieces);
  writer.set_i32_array("tokenizer.ggml.token_type", types);
  writer.write(path);
  const auto loaded = Tokenizer::from_gguf(GgufFile::open(path));

  EXPECT_EQ(loaded->types()[end_of_text], Tokenizer::kControl);
  EXPECT_TRUE(loaded->is_end_of_generation(end_of_text));
  const auto special = loaded->encode("ab</s>", Tokenizer::EncodeOptions{false, true});
  EXPECT_EQ(special.back(), end_of_text);
  const auto plain = loaded->encode("ab</s>", Tokenizer::EncodeOptions{false, false});
  EXPECT_EQ(std::ranges::count(plain, end_of_text), 0);
  EXPECT_EQ(loaded->decode(plain), " ab</s>");  // SentencePiece adds the leading space
  // "<sep>", user-defined and not an end-of-generation text, is still matched in plain text.
  const auto sep = static_cast<int32_t>(base.pieces().size() - 1);
  EXPECT_EQ(loaded->encode("<sep>", Tokenizer::EncodeOptions{false, false}),
            std::vector<int32_t>{sep});
  EXPECT_FALSE(loaded->is_end_of_generation(sep));
}

}  // namespace
}  // namespace protokv
