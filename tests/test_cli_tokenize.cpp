// SPDX-License-Identifier: Apache-2.0
// `protokv tokenize`: GGUF vocabularies and tokenizer.json, --json, --decode, --no-special, and
// one-line errors for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "protokv/tokenizer.h"
#include "test_util.h"

#include <fmt/format.h>

namespace protokv {
namespace {

using testing::CommandResult;
using testing::expect_one_line_error;
using testing::run_protokv;

// fmt, not "'" + string: GCC 12 reports a false -Wrestrict on the inlined concatenation.
std::string quoted(const std::filesystem::path& p) {
  return fmt::format("'{}'", p.string());
}

std::filesystem::path tokenizers_dir() {
  return testing::shared_dir() / "tokenizers";
}

// Exactly one line on stderr, mentioning `text`, and a non-zero exit.

TEST(CliTokenize, TokenizerJsonAndGguf) {
  const auto qwen = tokenizers_dir() / "hf" / "qwen3" / "tokenizer.json";
  const auto spm = tokenizers_dir() / "llama.cpp-vocab" / "ggml-vocab-llama-spm.gguf";
  if (!std::filesystem::exists(qwen) || !std::filesystem::exists(spm)) {
    GTEST_SKIP() << tokenizers_dir() << " not found (set PROTOKV_SHARED_DIR); skipping";
  }
  CommandResult r = run_protokv("tokenize -m " + quoted(qwen) + " -p 'Hi<|im_end|>' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], (std::vector<int32_t>{13048, 151645}));
  EXPECT_EQ(j["pieces"], (std::vector<std::string>{"Hi", "<|im_end|>"}));

  r = run_protokv("tokenize -m " + quoted(qwen) + " -p 'Hi<|im_end|>' --json --no-special");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(nlohmann::json::parse(r.out)["ids"].size(), 2u);

  r = run_protokv("tokenize -m " + quoted(qwen) + " --decode -p '13048 151645'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hi\n");  // the special token decodes to nothing

  // llama.cpp's own vector for "Hello world" (llama-spm), plus BOS on request.
  r = run_protokv("tokenize -m " + quoted(spm) + " -p 'Hello world' --bos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1\t<s>\n15043\t▁Hello\n3186\t▁world\n");

  testing::TempDir dir;
  std::ofstream(dir / "in.txt") << "a\tb\n";
  r = run_protokv("tokenize -m " + quoted(spm) + " -f " + quoted(dir / "in.txt") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out)["ids"].empty());
}

TEST(CliTokenize, BadInputGivesOneLineErrors) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name) << content;
    return quoted(dir / name);
  };
  const std::string model =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  const std::string pre =
      R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
  expect_one_line_error(run_protokv("tokenize -m " + write("t1.json", "{\"model\": {") + " -p x"),
                        "is not a valid JSON object");
  expect_one_line_error(
      run_protokv(
          "tokenize -m " +
          write("t2.json", fmt::format(R"({{{}, "pre_tokenizer": {{"type": "Punct"}}}})", model)) +
          " -p x"),
      "unknown pre-tokenizer 'Punct'");
  expect_one_line_error(
      run_protokv(
          "tokenize -m " +
          write("t3.json",
                fmt::format(R"({{"model": {{"type": "BPE", "vocab": {{"a": 0}}}}, {}}})", pre)) +
          " -p x"),
      "model.merges is missing or empty");
  const std::string good = write("t4.json", fmt::format("{{{}, {}}}", model, pre));
  expect_one_line_error(run_protokv("tokenize -m " + good), "give the input with -p TEXT");
  expect_one_line_error(run_protokv("tokenize -m " + good + " --decode -p '1 7'"),
                        "token id 7 out of range");
  expect_one_line_error(run_protokv("tokenize -m " + good + " --decode -p '1 x'"),
                        "'x' is not a token id");
  expect_one_line_error(run_protokv("tokenize -m " + quoted(dir / "missing.json") + " -p x"),
                        "cannot open tokenizer file");
  const CommandResult ok = run_protokv("tokenize -m " + good + " -p abba --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["ids"], (std::vector<int32_t>{2, 1, 0}));
}

// A full GGUF model file: its tokenizer gives the same ids as the llama2.c tokenizer.bin it was
// converted from (tok512 has no special tokens in this text, so both encoders agree).
TEST(CliTokenize, GgufModelMatchesLlama2cTokenizer) {
  PROTOKV_REQUIRE_STORIES();
  testing::TempDir dir;
  const auto gguf = dir / "stories.gguf";
  const CommandResult converted =
      run_protokv("convert " + quoted(testing::stories_dir() / "stories260K.bin") + " " +
                  quoted(testing::stories_dir() / "tok512.bin") + " -o " + quoted(gguf));
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  const std::string text = "Once upon a time,  there was a little girl named Lily.";
  const CommandResult r =
      run_protokv("tokenize -m " + quoted(gguf) + " -p '" + text + "' --bos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto reference =
      Tokenizer::load_llama2c((testing::stories_dir() / "tok512.bin").string(), 512);
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>(),
            reference->encode(text, true));
}

// generate --chat on stories260K (which has no chat template): forced family, clear errors.
TEST(CliGenerateChat, TemplateSelectionAndErrors) {
  PROTOKV_REQUIRE_STORIES();
  const std::string model = "-m " + quoted(testing::stories_dir() / "stories260K.bin") + " -z " +
                            quoted(testing::stories_dir() / "tok512.bin") + " -t 1";
  expect_one_line_error(run_protokv("generate " + model + " -p 'Once' --chat -n 4"),
                        "the model has no chat template");
  expect_one_line_error(
      run_protokv("generate " + model + " -p 'Once' --chat --chat-template nope -n 4"),
      "unknown chat template 'nope'");
  const CommandResult r = run_protokv("generate " + model +
                                      " -p 'Once' --chat --chat-template llama2 --system Be "
                                      "-n 4 --temp 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // "[INST] <<SYS>>\nBe\n<</SYS>>\n\nOnce [/INST]" is far longer than "Once" alone.
  EXPECT_GT(nlohmann::json::parse(r.out)["prompt_tokens"].get<int>(), 10);
}

}  // namespace
}  // namespace protokv
