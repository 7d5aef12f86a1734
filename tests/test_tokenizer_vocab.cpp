// SPDX-License-Identifier: Apache-2.0
// llama.cpp's own tokenizer test vectors (../shared/tokenizers/llama.cpp-vocab): every text of
// every ggml-vocab-NAME.gguf.inp must tokenize to exactly the ids of the .out line, as llama.cpp's
// test-tokenizer-0 checks them (add_special=false, parse_special=false).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

std::filesystem::path vocab_dir() {
  return testing::shared_dir() / "tokenizers" / "llama.cpp-vocab";
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp: texts separated by "\n__ggml_vocab_test__\n"; .out: one line of ids per text.
std::vector<VocabCase> read_cases(const std::string& name) {
  const auto base = vocab_dir() / ("ggml-vocab-" + name + ".gguf");
  const std::string inp = read_all(base.string() + ".inp");
  const std::string out = read_all(base.string() + ".out");
  std::vector<std::string> texts;
  const std::string separator = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  for (size_t hit; (hit = inp.find(separator, pos)) != std::string::npos;
       pos = hit + separator.size()) {
    texts.push_back(inp.substr(pos, hit - pos));
  }
  std::vector<VocabCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& text : texts) {
    EXPECT_TRUE(std::getline(lines, line)) << name << ": fewer .out lines than texts";
    VocabCase c{text, {}};
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  return cases;
}

class LlamaCppVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVocab, MatchesReferenceIds) {
  const std::string name = GetParam();
  const auto gguf = vocab_dir() / ("ggml-vocab-" + name + ".gguf");
  if (!std::filesystem::exists(gguf) || !std::filesystem::exists(gguf.string() + ".inp")) {
    GTEST_SKIP() << gguf << " not found (set PROTOKV_SHARED_DIR); skipping";
  }
  const auto tokenizer = Tokenizer::from_gguf(GgufFile::open(gguf.string()));
  const auto cases = read_cases(name);
  ASSERT_GT(cases.size(), 10u);
  int mismatches = 0;
  for (const VocabCase& c : cases) {
    const auto ids = tokenizer->encode(c.text, {.add_bos = false, .parse_special = false});
    if (ids != c.ids) {
      ++mismatches;
      ADD_FAILURE() << name << ": text '" << c.text << "' -> " << ::testing::PrintToString(ids)
                    << ", expected " << ::testing::PrintToString(c.ids);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " texts";
}

// Encode -> decode gives the text back (SentencePiece: after BOS, which drops the dummy prefix).
TEST_P(LlamaCppVocab, DecodeRoundTrips) {
  const std::string name = GetParam();
  const auto gguf = vocab_dir() / ("ggml-vocab-" + name + ".gguf");
  if (!std::filesystem::exists(gguf) || !std::filesystem::exists(gguf.string() + ".inp")) {
    GTEST_SKIP() << gguf << " not found (set PROTOKV_SHARED_DIR); skipping";
  }
  const auto tokenizer = Tokenizer::from_gguf(GgufFile::open(gguf.string()));
  for (const VocabCase& c : read_cases(name)) {
    const auto ids = tokenizer->encode(c.text, {.add_bos = true, .parse_special = false});
    EXPECT_EQ(tokenizer->decode(ids), c.text) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaCppVocab,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "deepseek-llm",
                                           "deepseek-coder", "falcon", "starcoder", "refact",
                                           "mpt"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace protokv
