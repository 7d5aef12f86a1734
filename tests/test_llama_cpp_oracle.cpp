// SPDX-License-Identifier: Apache-2.0
// protokv against llama.cpp on committed fixtures (tests/data/llama_cpp, made by
// tools/llama_cpp/make_fixtures.sh with llama.cpp de3ff81): tiny random-weight models per
// architecture x weight type, with llama.cpp's logits at every position of a fixed token
// sequence, teacher-forced in one batch. protokv must match them within a per-type tolerance, both
// prefilling each prefix and decoding token by token, and pick the same greedy token wherever
// llama.cpp's top-2 margin exceeds that tolerance. Runs in CI without llama.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/isa.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "test_util.h"

namespace protokv {
namespace {

std::filesystem::path fixture_dir() {
  return std::filesystem::path(PROTOKV_SOURCE_DIR) / "tests" / "data" / "llama_cpp";
}

// A .logits file of tools/llama_cpp/dump_logits.cpp.
struct OracleLogits {
  std::vector<int32_t> tokens;
  std::vector<int32_t> argmax;
  std::vector<float> logits;  // [n_tokens][n_vocab]
  int32_t n_vocab = 0;
  std::span<const float> row(size_t i) const {
    return {logits.data() + i * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab)};
  }
};

OracleLogits read_logits(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot open {}", path.string());
  char magic[8] = {};
  uint32_t header[3] = {};
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  PROTOKV_CHECK(in.good() && std::memcmp(magic, "PKVLOGIT", 8) == 0 && header[0] == 1,
                "{}: not a version-1 logits file", path.string());
  OracleLogits out;
  const size_t n = header[1];
  out.n_vocab = static_cast<int32_t>(header[2]);
  out.tokens.resize(n);
  out.argmax.resize(n);
  out.logits.resize(n * header[2]);
  in.read(reinterpret_cast<char*>(out.tokens.data()), static_cast<std::streamsize>(n * 4));
  in.read(reinterpret_cast<char*>(out.argmax.data()), static_cast<std::streamsize>(n * 4));
  in.read(reinterpret_cast<char*>(out.logits.data()),
          static_cast<std::streamsize>(out.logits.size() * 4));
  PROTOKV_CHECK(in.good() && in.peek() == std::char_traits<char>::eof(),
                "{}: truncated or too long", path.string());
  return out;
}

struct OracleCase {
  const char* arch;
  const char* type;
  // Max |protokv logit - llama.cpp logit| over the vocabulary at any position. Logits have a
  // standard deviation of about 1 on these models. The tolerances are about 3x the largest
  // difference measured when the case was enabled (printed by each test as "[ oracle   ]"); F32
  // gets 10x, its difference being float summation order alone.
  double tolerance;
};

void PrintTo(const OracleCase& c, std::ostream* os) {
  *os << c.arch << "_" << c.type;
}

// Every architecture x weight type, checked. F32 differs from llama.cpp only by summation order.
// llama.cpp's F16 and BF16 mat-muls round the activations to F16 / BF16 (ggml-cpu's vec_dot_type)
// and its quantised mat-muls quantise them to Q8_0 / Q8_K, while protokv's prefill computes in F32
// on the dequantised weights: the difference expected is manifest.tsv's act_rounding (llama.cpp on
// the file vs llama.cpp on its F32 dequantisation; measured 0.0012 F16, 0.008 BF16, 0.027 Q8_0,
// 0.030-0.046 Q4_0..Q6_K). Tolerances are about 3x act_rounding, rounded up; protokv's decode
// mat-vec also rounds activations as llama.cpp does for every quantised type and F16 (Q8_0 and
// Q4_0/Q4_1/Q5_0/Q5_1 to ggml's own Q8_0 / Q8_1 blocks, with its vec_dot arithmetic; F16 to F16,
// in ggml_vec_dot_f16's order), which the 3x covers (each test
// prints its measured difference as "[ oracle   ]"). With those, decode is bit-identical to
// llama.cpp on the Q4_1 fixtures, llama Q5_1 and gemma3 Q5_0; llama.cpp repacks Q4_0 for its
// own GEMM, and elsewhere an F32 ulp upstream can move one activation's int8 rounding.
constexpr OracleCase kEnabled[] = {
    {"llama", "F32", 1e-05},
    {"llama", "F16", 0.004},
    {"llama", "BF16", 0.025},
    {"llama", "Q8_0", 0.08},
    {"llama", "Q4_0", 0.1},
    {"llama", "Q4_1", 0.1},
    {"llama", "Q5_0", 0.1},
    {"llama", "Q5_1", 0.1},
    {"llama", "Q2_K", 0.15},
    {"llama", "Q3_K", 0.15},
    {"llama", "Q4_K", 0.12},
    {"llama", "Q5_K", 0.13},
    {"llama", "Q6_K", 0.12},
    {"qwen2", "F32", 1e-05},
    {"qwen2", "F16", 0.004},
    {"qwen2", "BF16", 0.025},
    {"qwen2", "Q8_0", 0.08},
    {"qwen2", "Q4_0", 0.1},
    {"qwen2", "Q4_1", 0.1},
    {"qwen2", "Q5_0", 0.1},
    {"qwen2", "Q5_1", 0.1},
    {"qwen2", "Q2_K", 0.15},
    {"qwen2", "Q3_K", 0.15},
    {"qwen2", "Q4_K", 0.12},
    {"qwen2", "Q5_K", 0.13},
    {"qwen2", "Q6_K", 0.12},
    {"qwen3", "F32", 1e-05},
    {"qwen3", "F16", 0.004},
    {"qwen3", "BF16", 0.025},
    {"qwen3", "Q8_0", 0.08},
    {"qwen3", "Q4_0", 0.1},
    {"qwen3", "Q4_1", 0.1},
    {"qwen3", "Q5_0", 0.1},
    {"qwen3", "Q5_1", 0.1},
    {"qwen3", "Q2_K", 0.15},
    {"qwen3", "Q3_K", 0.15},
    {"qwen3", "Q4_K", 0.12},
    {"qwen3", "Q5_K", 0.13},
    {"qwen3", "Q6_K", 0.12},
    // Gemma 3 (make_fixtures.sh: a sliding window of 8 on layer 0, crossed 24 times by the 32
    // tokens; layer 1 global; the real 270M file's weight types). Its activations are large
    // (embeddings x sqrt(dim) = 16, then post-norms), so llama.cpp's activation rounding is too:
    // act_rounding 0.33-0.43; measured 4.6e-5 F32 (10x), 0.23 Q8_0, 0.37 Q5_0, 0.38 Q4_K,
    // 0.38 Q6_K (about 3x).
    {"gemma3", "F32", 5e-4},
    {"gemma3", "Q8_0", 0.7},
    {"gemma3", "Q5_0", 1.1},
    {"gemma3", "Q4_K", 1.2},
    {"gemma3", "Q6_K", 1.2},
};

std::filesystem::path gguf_path(const OracleCase& c) {
  return fixture_dir() / (std::string(c.arch) + "_" + c.type + ".gguf");
}
std::filesystem::path logits_path(const OracleCase& c) {
  return fixture_dir() / (std::string(c.arch) + "_" + c.type + ".logits");
}

struct RowComparison {
  double max_abs_diff = 0.0;
  int32_t protokv_argmax = 0;
};

RowComparison compare_row(std::span<const float> protokv, std::span<const float> reference) {
  RowComparison out;
  for (size_t v = 0; v < reference.size(); ++v) {
    out.max_abs_diff = std::max(out.max_abs_diff, std::fabs(static_cast<double>(protokv[v]) -
                                                            static_cast<double>(reference[v])));
  }
  out.protokv_argmax =
      static_cast<int32_t>(std::max_element(protokv.begin(), protokv.end()) - protokv.begin());
  return out;
}

// llama.cpp's top-1 minus top-2 logit.
double top2_margin(std::span<const float> logits) {
  float first = -INFINITY, second = -INFINITY;
  for (const float v : logits) {
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  return static_cast<double>(first) - static_cast<double>(second);
}

class LlamaCppOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(LlamaCppOracle, TeacherForcedLogitsMatch) {
  const OracleCase c = GetParam();
  const OracleLogits ref = read_logits(logits_path(c));
  const LoadedModel model = load_model(gguf_path(c).string());
  ASSERT_EQ(model.weights.config.vocab_size, ref.n_vocab);
  const size_t n = ref.tokens.size();
  ASSERT_GE(n, 16u);

  // Decode: the first token prefilled, every later one decoded on top of the cache, so every
  // position is checked. Prefill: prefixes from an empty cache, their last logits against
  // llama.cpp's row, at the first four positions, every fourth after them and the last (all
  // positions would cost n prefills of up to n tokens).
  Session prefill_session(model.weights);
  Session decode_session(model.weights);
  double worst[2] = {0.0, 0.0};
  int64_t argmax_checked = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto reference = ref.row(i);
    const bool check_prefill = i < 4 || i % 4 == 3 || i + 1 == n;
    const std::vector<float> prefilled = [&] {
      if (!check_prefill) return std::vector<float>();
      const auto logits =
          prefill_session.prefill(std::span<const int32_t>(ref.tokens.data(), i + 1));
      return std::vector<float>(logits.begin(), logits.end());
    }();
    const std::vector<float> decoded = [&] {
      const auto logits =
          i == 0 ? decode_session.prefill(std::span<const int32_t>(ref.tokens.data(), 1))
                 : decode_session.decode(ref.tokens[i]);
      return std::vector<float>(logits.begin(), logits.end());
    }();
    const bool margin_ok = top2_margin(reference) > c.tolerance;
    argmax_checked += margin_ok ? 1 : 0;
    const std::vector<float>* runs[2] = {&prefilled, &decoded};
    for (int r = check_prefill ? 0 : 1; r < 2; ++r) {
      const RowComparison cmp = compare_row(*runs[r], reference);
      worst[r] = std::max(worst[r], cmp.max_abs_diff);
      EXPECT_LE(cmp.max_abs_diff, c.tolerance)
          << (r == 0 ? "prefill" : "decode") << " position " << i;
      if (margin_ok) {
        EXPECT_EQ(cmp.protokv_argmax, ref.argmax[i])
            << (r == 0 ? "prefill" : "decode") << " position " << i << ", llama.cpp margin "
            << top2_margin(reference);
      }
    }
  }
  // Enough positions must have a margin above the tolerance, or the argmax check says little (the
  // 2-bit fixtures have the flattest logits: 15 of 32 positions for llama Q2_K).
  EXPECT_GE(argmax_checked, static_cast<int64_t>(n) * 2 / 5);
  std::printf(
      "[ oracle   ] %s_%s: max |dlogit| prefill %.3g, decode %.3g (tolerance %.3g); argmax "
      "checked at %lld of %zu positions\n",
      c.arch, c.type, worst[0], worst[1], c.tolerance, static_cast<long long>(argmax_checked), n);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaCppOracle, ::testing::ValuesIn(kEnabled),
                         [](const ::testing::TestParamInfo<OracleCase>& info) {
                           return std::string(info.param.arch) + "_" + info.param.type;
                         });

// SessionOptions::llama_cpp_arithmetic: on the fixtures whose every operation protokv can take in
// llama.cpp's order (F32, F16 and the legacy quants; not BF16, the K-quants or Gemma 3's
// sliding-window layers), the logits of the whole sequence appended in one batch, as llama.cpp
// ran it, equal llama.cpp's to the bit. The orders are those of a llama.cpp built for AVX-512
// (the fixtures' machine; kernels/llama_cpp_order.h): on a CPU where protokv runs another
// variant, the test checks the results agree within the fixture's tolerance instead.
class LlamaCppArithmetic : public ::testing::TestWithParam<OracleCase> {};

TEST_P(LlamaCppArithmetic, OneBatchLogitsEqualLlamaCpp) {
  const OracleCase c = GetParam();
  const OracleLogits ref = read_logits(logits_path(c));
  const LoadedModel model = load_model(gguf_path(c).string());
  SessionOptions options;
  options.llama_cpp_arithmetic = true;
  Session session(model.weights, options);
  std::vector<std::vector<float>> rows;
  session.append(ref.tokens, [&](int64_t, std::span<const float> logits) {
    rows.emplace_back(logits.begin(), logits.end());
  });
  ASSERT_EQ(rows.size(), ref.tokens.size());
  const bool same_order = kernels::active_isa() == kernels::Isa::kAvx512;
  double worst = 0.0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double diff = compare_row(rows[i], ref.row(i)).max_abs_diff;
    worst = std::max(worst, diff);
    EXPECT_LE(diff, same_order ? 0.0 : c.tolerance) << "position " << i;
  }
  std::printf("[ oracle   ] %s_%s with llama.cpp's arithmetic (%s): max |dlogit| %.3g\n", c.arch,
              c.type, same_order ? "bit for bit" : "another variant", worst);
}

// The least tolerance of the flash-attention fixtures where protokv runs another variant than
// the fixtures' (avx512): measured 6e-5 on F32 weights with avx2 and scalar.
constexpr double kFlashTolerance = 5e-4;

// As llama-completion evaluates a text (<arch>_<type>.completion.logits: `protokv-dump-logits
// --prompt 5 --last-prompt-logits`): a 5-token prompt in one batch, whose last row alone goes
// through the last layer's FFN (which F32 weights show: F16 ones round the FFN's inner
// activation to F16, which hides it here), then one token per step. With flash attention
// (.fa_completion.logits, SessionOptions::llama_cpp_flash_attention): ggml's one-chunk path, over
// K/V that llama.cpp casts to F16.
TEST(LlamaCppArithmeticCompletion, PromptThenDecodeLogitsEqualLlamaCpps) {
  const bool same_order = kernels::active_isa() == kernels::Isa::kAvx512;
  constexpr size_t kPrompt = 5;
  for (const bool flash_attention : {false, true})
    for (const char* arch : {"llama", "qwen3"}) {
      for (const auto& [type, tolerance] : {std::pair{"F32", 1e-5}, std::pair{"F16", 0.004},
                                            std::pair{"Q8_0", 0.08}, std::pair{"Q4_1", 0.1}}) {
        SCOPED_TRACE(std::string(arch) + "_" + type + (flash_attention ? " fa" : ""));
        const std::string stem = (fixture_dir() / (std::string(arch) + "_" + type)).string();
        const OracleLogits ref =
            read_logits(stem + (flash_attention ? ".fa_completion.logits" : ".completion.logits"));
        // Another variant's last bits can move a rounding of flash attention's F16 accumulator.
        const double allowed = flash_attention ? std::max(tolerance, kFlashTolerance) : tolerance;
        ASSERT_GT(ref.tokens.size(), kPrompt);
        EXPECT_EQ(ref.argmax[kPrompt - 2], -1);  // no logits for the prompt's other rows
        const LoadedModel model = load_model(stem + ".gguf");
        SessionOptions options;
        options.llama_cpp_arithmetic = true;
        options.llama_cpp_flash_attention = flash_attention;
        Session session(model.weights, options);
        double worst = 0.0;
        for (size_t i = kPrompt - 1; i < ref.tokens.size(); ++i) {
          const auto logits =
              i + 1 == kPrompt
                  ? session.prefill(std::span<const int32_t>(ref.tokens.data(), kPrompt))
                  : session.decode(ref.tokens[i]);
          const double diff = compare_row(logits, ref.row(i)).max_abs_diff;
          worst = std::max(worst, diff);
          EXPECT_LE(diff, same_order ? 0.0 : allowed) << "position " << i;
        }
        std::printf(
            "[ oracle   ] %s_%s as llama-completion with llama.cpp's arithmetic%s: "
            "max |dlogit| %.3g\n",
            arch, type, flash_attention ? " and flash attention" : "", worst);
      }
    }
}

// llama.cpp's flash attention over a batch of 64 rows (<arch>_<type>.fa_batch.logits, every
// row's logits): ggml's tiled path (tiles of 64 cells, simd_gemm's FMA order, per-tile softmax
// sums in double).
TEST(LlamaCppArithmeticCompletion, FlashAttentionBatchOf64RowsEqualsLlamaCpps) {
  const bool same_order = kernels::active_isa() == kernels::Isa::kAvx512;
  for (const char* arch : {"llama", "qwen3"}) {
    for (const auto& [type, tolerance] : {std::pair{"F32", 1e-5}, std::pair{"F16", 0.004},
                                          std::pair{"Q8_0", 0.08}, std::pair{"Q4_1", 0.1}}) {
      SCOPED_TRACE(std::string(arch) + "_" + type);
      const std::string stem = (fixture_dir() / (std::string(arch) + "_" + type)).string();
      const OracleLogits ref = read_logits(stem + ".fa_batch.logits");
      ASSERT_EQ(ref.tokens.size(), 64u);
      const LoadedModel model = load_model(stem + ".gguf");
      SessionOptions options;
      options.llama_cpp_arithmetic = true;
      options.llama_cpp_flash_attention = true;
      Session session(model.weights, options);
      std::vector<std::vector<float>> rows;
      session.append(ref.tokens, [&](int64_t, std::span<const float> logits) {
        rows.emplace_back(logits.begin(), logits.end());
      });
      ASSERT_EQ(rows.size(), ref.tokens.size());
      double worst = 0.0;
      for (size_t i = 0; i < rows.size(); ++i) {
        const double diff = compare_row(rows[i], ref.row(i)).max_abs_diff;
        worst = std::max(worst, diff);
        EXPECT_LE(diff, same_order ? 0.0 : std::max(tolerance, kFlashTolerance))
            << "position " << i;
      }
      std::printf(
          "[ oracle   ] %s_%s, 64 rows with llama.cpp's flash attention: max |dlogit| %.3g\n", arch,
          type, worst);
    }
  }
}

constexpr OracleCase kLlamaCppOrder[] = {
    {"llama", "F32", 1e-05}, {"llama", "F16", 0.004}, {"llama", "Q8_0", 0.08},
    {"llama", "Q4_0", 0.1},  {"llama", "Q4_1", 0.1},  {"llama", "Q5_0", 0.1},
    {"llama", "Q5_1", 0.1},  {"qwen2", "F32", 1e-05}, {"qwen2", "F16", 0.004},
    {"qwen2", "Q8_0", 0.08}, {"qwen2", "Q4_0", 0.1},  {"qwen2", "Q4_1", 0.1},
    {"qwen2", "Q5_0", 0.1},  {"qwen2", "Q5_1", 0.1},  {"qwen3", "F32", 1e-05},
    {"qwen3", "F16", 0.004}, {"qwen3", "Q8_0", 0.08}, {"qwen3", "Q4_0", 0.1},
    {"qwen3", "Q4_1", 0.1},  {"qwen3", "Q5_0", 0.1},  {"qwen3", "Q5_1", 0.1},
};

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaCppArithmetic, ::testing::ValuesIn(kLlamaCppOrder),
                         [](const ::testing::TestParamInfo<OracleCase>& info) {
                           return std::string(info.param.arch) + "_" + info.param.type;
                         });

TEST(LlamaCppOracleFixtures, EnabledFixturesAreSmallAndConsistent) {
  for (const OracleCase& c : kEnabled) {
    SCOPED_TRACE(gguf_path(c).string());
    ASSERT_TRUE(std::filesystem::exists(gguf_path(c)));
    EXPECT_LE(std::filesystem::file_size(gguf_path(c)), 2u << 20);
    const OracleLogits ref = read_logits(logits_path(c));
    for (size_t i = 0; i < ref.tokens.size(); ++i) {
      const auto row = ref.row(i);
      EXPECT_EQ(ref.argmax[i], std::max_element(row.begin(), row.end()) - row.begin());
    }
  }
}

}  // namespace
}  // namespace protokv
