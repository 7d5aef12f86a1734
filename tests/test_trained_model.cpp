// SPDX-License-Identifier: Apache-2.0
// The recall model shipped in models/ (trained by tools/train/train_recall.py, card in
// models/protokv-recall.md): it loads as a plain Llama GGUF, with no special case, and the engine
// reproduces the training framework's greedy output.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "protokv/model.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

std::filesystem::path recall_model_path() {
  return std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf";
}

TEST(TrainedModel, LoadsAsAPlainLlamaWithGqa) {
  const LoadedModel model = load_model(recall_model_path().string());
  const ModelConfig& c = model.weights.config;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_FALSE(c.rope_neox);  // Meta pair order, as it was trained
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_GE(c.head_dim(), 32);
  EXPECT_GE(c.n_heads / c.n_kv_heads, 2);
  ASSERT_NE(model.tokenizer, nullptr);
  EXPECT_EQ(model.tokenizer->vocab_size(), 512);
}

// Greedy continuation of a fixed prompt with the full cache, pinned to what the training
// framework computes (torch 1.13, F32, tools/train/check_export.py --state): the engine runs the
// exported weights, RoPE order and base exactly as they were trained, and the F16 storage does not
// change the greedy path.
TEST(TrainedModel, GreedyContinuationMatchesTheTrainingFramework) {
  const testing::CommandResult r =
      testing::run_protokv("generate -m '" + recall_model_path().string() +
                           "' -p 'Once upon a time' -n 24 --temp 0 --json -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::vector<int32_t> torch_greedy = {432, 383, 286, 261, 376, 298, 315, 421,
                                             395, 317, 426, 338, 401, 396, 267, 337,
                                             410, 410, 410, 295, 295, 295, 426, 385};
  EXPECT_EQ(j["generated_tokens"].get<std::vector<int32_t>>(), torch_greedy) << r.out;
  EXPECT_EQ(j["text"], ", there was a little girl named Lily. She loved to play   ararar. One");
}

// The model's job: with the full cache it answers a single-needle question of `eval niah`
// (needle at half depth in RULER's noise haystack, 512 and 2032 tokens) with the needle's exact
// 7-digit value.
TEST(TrainedModel, AnswersANeedleQuestionWithTheFullCache) {
  const testing::CommandResult r =
      testing::run_protokv("eval niah -m '" + recall_model_path().string() +
                           "' --lengths 512,2032 --depths 50 --samples 1 --json --quiet -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["cells"]["full"].size(), 2u) << r.out;
  for (const auto& cell : j["cells"]["full"]) {
    EXPECT_EQ(cell["accuracy"].get<double>(), 1.0) << cell.dump();
  }
}

}  // namespace
}  // namespace protokv
