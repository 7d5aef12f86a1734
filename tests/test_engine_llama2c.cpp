// SPDX-License-Identifier: Apache-2.0
// llama2.c checkpoint loader: round trip of a random model through the file format, the real
// stories260K checkpoint, and corrupt files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "model/loaders.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/sampler.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::RandomModelSpec;
using testing::TempDir;

std::vector<char> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::filesystem::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The error message is one line naming the file.
void expect_load_error(const std::filesystem::path& path) {
  try {
    load_llama2c_model(path.string());
    FAIL() << "loading must fail";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(path.filename().string()), std::string::npos) << message;
  }
}

TEST(Llama2cLoader, RoundTripGivesTheSameModel) {
  for (bool shared : {false, true}) {
    RandomModelSpec spec;
    spec.shared_classifier = shared;
    spec.n_layers = 3;
    const auto model = make_random_model(spec);
    TempDir dir;
    testing::write_llama2c(model, dir / "model.bin");
    const ModelWeights loaded = load_llama2c_model((dir / "model.bin").string());

    const ModelConfig& c = loaded.config;
    EXPECT_EQ(c.dim, spec.dim);
    EXPECT_EQ(c.hidden_dim, spec.hidden_dim);
    EXPECT_EQ(c.n_layers, spec.n_layers);
    EXPECT_EQ(c.n_heads, spec.n_heads);
    EXPECT_EQ(c.n_kv_heads, spec.n_kv_heads);
    EXPECT_EQ(c.vocab_size, spec.vocab_size);
    EXPECT_EQ(c.context_length, spec.context_length);
    EXPECT_EQ(c.shared_classifier, shared);
    EXPECT_FALSE(c.rope_neox);
    EXPECT_EQ(loaded.parameter_count(), model.weights.parameter_count());
    EXPECT_EQ(loaded.weight_bytes(), model.weights.weight_bytes());

    const std::vector<int32_t> tokens = {1, 40, 2, 299, 17, 0, 8};
    Session expected(model.weights), actual(loaded);
    const auto a = expected.prefill(tokens);
    const std::vector<float> want(a.begin(), a.end());
    const auto b = actual.prefill(tokens);
    EXPECT_EQ(std::vector<float>(b.begin(), b.end()), want) << "shared=" << shared;
  }
}

TEST(Llama2cLoader, RejectsWrongSizes) {
  RandomModelSpec spec;
  const auto model = make_random_model(spec);
  TempDir dir;
  testing::write_llama2c(model, dir / "good.bin");
  const auto bytes = read_bytes(dir / "good.bin");
  ASSERT_NO_THROW(load_llama2c_model((dir / "good.bin").string()));

  for (size_t cut : {size_t{0}, size_t{3}, size_t{27}, size_t{28}, size_t{1000}, bytes.size() / 2,
                     bytes.size() - 4 * spec.vocab_size * spec.dim, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    write_bytes(dir / "cut.bin",
                std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(cut)));
    expect_load_error(dir / "cut.bin");
  }
  auto longer = bytes;
  longer.resize(bytes.size() + 4, 0);
  write_bytes(dir / "long.bin", longer);
  expect_load_error(dir / "long.bin");
}

TEST(Llama2cLoader, RejectsBadHeaders) {
  RandomModelSpec spec;
  const auto model = make_random_model(spec);
  TempDir dir;
  testing::write_llama2c(model, dir / "good.bin");
  const auto bytes = read_bytes(dir / "good.bin");
  auto with_field = [&](int field, int32_t value) {
    auto copy = bytes;
    std::memcpy(copy.data() + 4 * field, &value, 4);
    return copy;
  };
  const std::vector<std::pair<int, int32_t>> cases = {
      {0, -64},
      {0, 0},
      {1, -1},
      {2, 0},
      {2, -2},
      {3, 0},
      {3, 5},
      {4, 3},
      {4, 8},
      {5, 0},
      {6, 0},
      {6, -256},
      {0, 1 << 30},
      {1, 1 << 30},
      {2, 1 << 30},
      {5, INT32_MIN},
      {6, 1 << 30},
      {5, 1 << 30},
      {3, 64},  // head_dim 1: odd
      // valid shapes that do not match the file's size
      {1, 100},
      {2, 1000},
      {6, 4096},
      {5, -301},
  };
  for (const auto& [field, value] : cases) {
    SCOPED_TRACE(::testing::Message() << "field " << field << " = " << value);
    write_bytes(dir / "bad.bin", with_field(field, value));
    expect_load_error(dir / "bad.bin");
  }
  // A changed sign of the vocabulary flips the classifier flag: then the size no longer matches.
  write_bytes(dir / "flip.bin", with_field(5, spec.vocab_size));
  expect_load_error(dir / "flip.bin");
}

TEST(Llama2cLoader, MissingFileIsAnError) {
  TempDir dir;
  EXPECT_THROW(load_llama2c_model((dir / "absent.bin").string()), Error);
}

// The published greedy continuation of stories260K after BOS, as token ids, is checked as text
// in test_cli_generate.cpp; here the real checkpoint is checked to load with its documented
// header and to run prefill/decode consistently.
TEST(Llama2cLoader, Stories260kHeaderAndConsistency) {
  PROTOKV_REQUIRE_STORIES();
  const auto path = testing::stories_dir() / "stories260K.bin";
  const ModelWeights w = load_llama2c_model(path.string());
  EXPECT_EQ(w.config.dim, 64);
  EXPECT_EQ(w.config.hidden_dim, 172);
  EXPECT_EQ(w.config.n_layers, 5);
  EXPECT_EQ(w.config.n_heads, 8);
  EXPECT_EQ(w.config.n_kv_heads, 4);
  EXPECT_EQ(w.config.vocab_size, 512);
  EXPECT_EQ(w.config.context_length, 512);

  // Greedy 30 tokens by decode from BOS, then the same sequence prefilled at once: the last
  // logits agree.
  Session stepwise(w);
  std::vector<int32_t> tokens = {1};
  auto logits = stepwise.prefill(tokens);
  for (int i = 0; i < 30; ++i) {
    tokens.push_back(argmax(logits));
    logits = stepwise.decode(tokens.back());
  }
  const std::vector<float> last(logits.begin(), logits.end());
  Session whole(w);
  const auto prefilled = whole.prefill(tokens);
  for (size_t i = 0; i < last.size(); ++i)
    ASSERT_NEAR(prefilled[i], last[i], 1e-4f * std::max(1.0f, std::fabs(last[i])));
}

}  // namespace
}  // namespace protokv
