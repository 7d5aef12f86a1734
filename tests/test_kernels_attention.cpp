// SPDX-License-Identifier: Apache-2.0
// Tiled causal prefill attention and decode attention against the full-matrix softmax.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernel_reference.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "protokv/dtype.h"
#include "protokv/error.h"
#include "protokv/key_segment.h"

namespace protokv::kernels {
namespace {

using protokv::testing::random_vector;
using protokv::testing::ref_causal_attention;
using protokv::testing::ref_decode_attention;

// Outputs are convex combinations of N(0,1) values: F32 error is ~1e-6.
constexpr double kAttentionTolerance = 2e-5;

TEST(KernelsAttention, PrefillMatchesFullCausalSoftmax) {
  std::mt19937 rng(20);
  const bool small = protokv::testing::sanitized_build();
  // 600 tokens: several query and key tiles, the last ones partial.
  const std::vector<int64_t> lengths =
      small ? std::vector<int64_t>{1, 7, 33, 300} : std::vector<int64_t>{1, 7, 33, 300, 600};
  for (int d : {2, 8, 64, 128}) {
    for (int64_t n : lengths) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " d=" << d);
      // Larger logits than N(0,1) keys would give, so the online max really moves.
      const auto q = random_vector(rng, n * d, 2.0f);
      const auto k = random_vector(rng, n * d, 2.0f);
      const auto v = random_vector(rng, n * d);
      std::vector<float> out(static_cast<size_t>(n * d), NAN);
      attention_prefill(q.data(), k.data(), v.data(), n, d, out.data());
      const auto expected = ref_causal_attention(q.data(), d, k.data(), v.data(), d, n, 0, d);
      for (int64_t i = 0; i < n * d; ++i)
        ASSERT_NEAR(out[i], expected[i], kAttentionTolerance) << "token " << i / d;
    }
  }
}

struct GqaCase {
  int n_heads, n_kv_heads, d;
  int64_t n_queries, n_past;
};

// Queries/outputs in the projection layout [n, n_heads * d], keys/values per KV head
// [n_kv_heads][n_past + n, d]; each query head checked against its KV head's reference.
void check_prefill_heads(Isa isa, const GqaCase& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << isa_name(isa) << " heads=" << c.n_heads << "/" << c.n_kv_heads << " d=" << c.d
               << " n=" << c.n_queries << " past=" << c.n_past);
  const int64_t n_keys = c.n_past + c.n_queries;
  const int64_t q_stride = int64_t{c.n_heads} * c.d;
  const auto q = random_vector(rng, c.n_queries * q_stride, 2.0f);
  const auto k = random_vector(rng, c.n_kv_heads * n_keys * c.d, 2.0f);
  const auto v = random_vector(rng, c.n_kv_heads * n_keys * c.d);
  std::vector<float> out(q.size(), NAN);
  attention_prefill_heads(isa, {q.data(), q_stride, c.d}, {k.data(), c.d, n_keys * c.d},
                          {v.data(), c.d, n_keys * c.d}, {out.data(), q_stride, c.d}, c.n_queries,
                          c.n_past, c.n_heads, c.n_kv_heads, c.d);
  const int group = c.n_heads / c.n_kv_heads;
  for (int h = 0; h < c.n_heads; ++h) {
    const int64_t kv_offset = (h / group) * n_keys * c.d;
    const auto expected =
        ref_causal_attention(q.data() + h * c.d, q_stride, k.data() + kv_offset,
                             v.data() + kv_offset, c.d, c.n_queries, c.n_past, c.d);
    for (int64_t t = 0; t < c.n_queries; ++t)
      for (int i = 0; i < c.d; ++i)
        ASSERT_NEAR(out[t * q_stride + h * c.d + i], expected[t * c.d + i], kAttentionTolerance)
            << "head " << h << " token " << t;
  }
}

TEST(KernelsAttention, PrefillHeadsHandlesGqaGroupsStridesAndChunks) {
  std::mt19937 rng(21);
  const bool small = protokv::testing::sanitized_build();
  std::vector<GqaCase> cases = {
      {4, 4, 8, 1, 0},    {4, 2, 8, 7, 0},   {8, 1, 16, 33, 0},  {6, 2, 64, 100, 0},
      {8, 2, 32, 45, 20}, {2, 1, 8, 1, 300}, {4, 1, 64, 130, 0}, {3, 3, 2, 9, 4},
      {200, 1, 4, 5, 3},  // a group larger than a query tile
  };
  if (!small) cases.push_back({8, 2, 64, 300, 257});
  for (Isa isa : available_isas())
    for (const GqaCase& c : cases) check_prefill_heads(isa, c, rng);
}

// The prefill kernels pin BLAS to the calling thread while they run; the caller's thread
// setting must be back afterwards.
TEST(KernelsAttention, PrefillRestoresTheThreadSetting) {
  const int before = omp_get_max_threads();
  std::mt19937 rng(25);
  const int64_t n = 40;
  const int d = 8;
  const auto q = random_vector(rng, n * d), k = random_vector(rng, n * d);
  const auto v = random_vector(rng, n * d);
  std::vector<float> out(n * d);
  attention_prefill(q.data(), k.data(), v.data(), n, d, out.data());
  EXPECT_EQ(omp_get_max_threads(), before);
  attention_prefill_heads({q.data(), d, d}, {k.data(), d, d}, {v.data(), d, d}, {out.data(), d, d},
                          n, 0, 1, 1, d);
  EXPECT_EQ(omp_get_max_threads(), before);
}

TEST(KernelsAttention, PrefillHeadsRejectsHeadsThatDoNotGroup) {
  std::vector<float> buffer(64);
  const HeadsView view{buffer.data(), 8, 8};
  EXPECT_THROW(attention_prefill_heads(view, view, view, {buffer.data(), 8, 8}, 1, 0, 3, 2, 8),
               Error);
}

TEST(KernelsAttention, DecodeMatchesReferenceWithAndWithoutLogWeights) {
  std::mt19937 rng(22);
  for (int d : {2, 8, 64, 128}) {
    for (int64_t n : {1, 7, 33, 300}) {
      for (bool weighted : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " d=" << d << " weighted=" << weighted);
        const auto q = random_vector(rng, d, 2.0f);
        const auto keys = random_vector(rng, n * d, 2.0f);
        const auto values = random_vector(rng, n * d);
        std::vector<float> log_weights(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) log_weights[j] = std::log(1.0f + static_cast<float>(j % 5));
        const float* lw = weighted ? log_weights.data() : nullptr;
        std::vector<double> expected_probs;
        const auto expected =
            ref_decode_attention(q.data(), keys.data(), values.data(), lw, n, d, &expected_probs);
        std::vector<float> out(d, NAN), probs(static_cast<size_t>(n), NAN);
        attention_decode(q.data(), keys.data(), values.data(), lw, n, d, out.data(), probs.data());
        for (int i = 0; i < d; ++i) ASSERT_NEAR(out[i], expected[i], kAttentionTolerance);
        for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(probs[j], expected_probs[j], 1e-6);
        std::vector<float> out_no_probs(d, NAN);
        attention_decode(q.data(), keys.data(), values.data(), lw, n, d, out_no_probs.data(),
                         nullptr);
        EXPECT_EQ(out_no_probs, out);
      }
    }
  }
}

// Chelsea Eq. 2: an entry with log-weight log(m) attends exactly like m copies of itself.
TEST(KernelsAttention, DecodeLogWeightEqualsDuplicatedEntries) {
  std::mt19937 rng(23);
  const int d = 16;
  const auto q = random_vector(rng, d);
  const auto k = random_vector(rng, 2 * d);
  const auto v = random_vector(rng, 2 * d);
  std::vector<float> k_dup, v_dup;
  for (int copy = 0; copy < 3; ++copy) {
    k_dup.insert(k_dup.end(), k.begin(), k.begin() + d);
    v_dup.insert(v_dup.end(), v.begin(), v.begin() + d);
  }
  k_dup.insert(k_dup.end(), k.begin() + d, k.end());
  v_dup.insert(v_dup.end(), v.begin() + d, v.end());
  const std::vector<float> log_weights = {std::log(3.0f), 0.0f};
  std::vector<float> merged(d), duplicated(d), probs(2), dup_probs(4);
  attention_decode(q.data(), k.data(), v.data(), log_weights.data(), 2, d, merged.data(),
                   probs.data());
  attention_decode(q.data(), k_dup.data(), v_dup.data(), nullptr, 4, d, duplicated.data(),
                   dup_probs.data());
  for (int i = 0; i < d; ++i) EXPECT_NEAR(merged[i], duplicated[i], 1e-6);
  EXPECT_NEAR(probs[0], dup_probs[0] + dup_probs[1] + dup_probs[2], 1e-6);
}

TEST(KernelsAttention, DecodeGroupEqualsPerHeadDecode) {
  std::mt19937 rng(24);
  for (Isa isa : available_isas()) {
    for (int group : {1, 3, 4, 8}) {
      // Lengths across several key blocks and 4-key steps; widths with vector tails.
      for (auto [n, d] :
           {std::pair<int64_t, int>{1, 64}, {5, 8}, {33, 72}, {300, 64}, {301, 130}, {7, 2}}) {
        SCOPED_TRACE(::testing::Message()
                     << isa_name(isa) << " group=" << group << " n=" << n << " d=" << d);
        const auto q = random_vector(rng, group * d, 2.0f);
        const auto keys = random_vector(rng, n * d, 2.0f);
        const auto values = random_vector(rng, n * d);
        const auto log_weights = random_vector(rng, n, 0.5f);
        std::vector<float> out(group * d, NAN), probs(group * n, NAN);
        attention_decode_group(isa, q.data(), group, keys.data(), values.data(), log_weights.data(),
                               n, d, out.data(), probs.data());
        for (int h = 0; h < group; ++h) {
          std::vector<double> expected_probs;
          const auto expected = ref_decode_attention(q.data() + h * d, keys.data(), values.data(),
                                                     log_weights.data(), n, d, &expected_probs);
          for (int i = 0; i < d; ++i)
            ASSERT_NEAR(out[h * d + i], expected[i], kAttentionTolerance) << "head " << h;
          for (int64_t j = 0; j < n; ++j)
            ASSERT_NEAR(probs[h * n + j], expected_probs[j], 1e-6) << "head " << h;
        }
      }
    }
  }
}

// The gathered kernel reads rows `indices` in place; the dense kernel gets the same rows copied
// into a contiguous block. Both must agree (and with the double-precision reference), with and
// without log-weights; without probabilities the kernel keeps its scores in scratch and gives the
// same output.
void expect_gathered_equals_dense(Isa isa, const std::vector<float>& q,
                                  const std::vector<float>& keys, const std::vector<float>& values,
                                  const std::vector<float>& log_weights,
                                  const std::vector<int32_t>& indices, int d) {
  const auto m = static_cast<int64_t>(indices.size());
  std::vector<float> sub_k, sub_v, sub_lw;
  for (int32_t i : indices) {
    sub_k.insert(sub_k.end(), keys.begin() + i * d, keys.begin() + (i + 1) * d);
    sub_v.insert(sub_v.end(), values.begin() + i * d, values.begin() + (i + 1) * d);
    sub_lw.push_back(log_weights[static_cast<size_t>(i)]);
  }
  for (const bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "log-weights" : "no log-weights");
    const float* lw = weighted ? log_weights.data() : nullptr;
    const float* sub = weighted ? sub_lw.data() : nullptr;
    std::vector<float> dense(d, NAN), dense_probs(m, NAN), gathered(d, NAN), probs(m, NAN);
    attention_decode_group(isa, q.data(), 1, sub_k.data(), sub_v.data(), sub, m, d, dense.data(),
                           dense_probs.data());
    attention_decode_gathered(isa, q.data(), keys.data(), values.data(), lw, indices, d,
                              gathered.data(), probs.data());
    std::vector<double> expected_probs;
    const auto expected =
        ref_decode_attention(q.data(), sub_k.data(), sub_v.data(), sub, m, d, &expected_probs);
    for (int i = 0; i < d; ++i) {
      ASSERT_NEAR(gathered[i], dense[i], 1e-5);
      ASSERT_NEAR(gathered[i], expected[i], kAttentionTolerance);
    }
    for (int64_t j = 0; j < m; ++j) {
      ASSERT_NEAR(probs[j], dense_probs[j], 1e-6);
      ASSERT_NEAR(probs[j], expected_probs[static_cast<size_t>(j)], 1e-6);
    }
    std::vector<float> no_probs(d, NAN);
    attention_decode_gathered(isa, q.data(), keys.data(), values.data(), lw, indices, d,
                              no_probs.data(), nullptr);
    EXPECT_EQ(no_probs, gathered);
  }
}

TEST(KernelsAttention, GatheredDecodeEqualsDenseDecodeOnTheSubset) {
  std::mt19937 rng(31);
  for (Isa isa : available_isas()) {
    for (auto [n, d] : {std::pair<int64_t, int>{1, 64}, {40, 8}, {300, 72}, {513, 130}, {9, 2}}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " n=" << n << " d=" << d);
      const auto q = random_vector(rng, d, 2.0f);
      const auto keys = random_vector(rng, n * d, 2.0f);
      const auto values = random_vector(rng, n * d);
      const auto log_weights = random_vector(rng, n, 0.5f);
      // A shuffled subset of about a third of the rows (at least one).
      std::vector<int32_t> indices(static_cast<size_t>(n));
      std::iota(indices.begin(), indices.end(), 0);
      std::shuffle(indices.begin(), indices.end(), rng);
      indices.resize(static_cast<size_t>(std::max<int64_t>(1, n / 3)));
      expect_gathered_equals_dense(isa, q, keys, values, log_weights, indices, d);
    }
  }
}

// Non-overlapping spans of consecutive rows of [0, n) (lengths 1 to 13, the last row always in
// one), in shuffled span order: the layout a cluster-contiguous recall (ClusterKV) hands over.
std::vector<int32_t> shuffled_spans(std::mt19937& rng, int64_t n) {
  std::vector<std::pair<int32_t, int32_t>> spans;  // [begin, end)
  std::uniform_int_distribution<int32_t> length(1, 13), gap(0, 6);
  for (int32_t begin = gap(rng); begin < n; begin += length(rng) + gap(rng)) {
    const int32_t end = std::min<int32_t>(static_cast<int32_t>(n), begin + length(rng));
    spans.emplace_back(begin, end);
    begin = end;
  }
  if (spans.empty() || spans.back().second != n)
    spans.emplace_back(static_cast<int32_t>(n) - 1, static_cast<int32_t>(n));
  std::shuffle(spans.begin(), spans.end(), rng);
  std::vector<int32_t> indices;
  for (auto [begin, end] : spans)
    for (int32_t e = begin; e < end; ++e) indices.push_back(e);
  return indices;
}

TEST(KernelsAttention, GatheredDecodeOverContiguousSpansEqualsDenseDecodeOnTheSubset) {
  // Runs of consecutive rows take the kernel's span path (4-row dots, weighted row sums), single
  // rows the row path.
  std::mt19937 rng(37);
  for (Isa isa : available_isas()) {
    for (auto [n, d] : {std::pair<int64_t, int>{1, 64}, {97, 8}, {300, 64}, {700, 130}, {40, 3}}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " n=" << n << " d=" << d);
      const auto q = random_vector(rng, d, 2.0f);
      const auto keys = random_vector(rng, n * d, 2.0f);
      const auto values = random_vector(rng, n * d);
      const auto log_weights = random_vector(rng, n, 0.5f);
      expect_gathered_equals_dense(isa, q, keys, values, log_weights, shuffled_spans(rng, n), d);
    }
  }
}

TEST(KernelsAttention, GatheredSegmentsSplitRunsAtSegmentBoundaries) {
  // Runs that cross from one key segment into the next (PoD's held / borrowed / held keys, the
  // middle one with its own query) are read from each segment's own rows.
  std::mt19937 rng(41);
  const int64_t n = 120;
  const int d = 16;
  const auto q = random_vector(rng, d, 2.0f);
  const auto lender_q = random_vector(rng, d, 2.0f);
  const auto keys = random_vector(rng, n * d, 2.0f);
  const auto values = random_vector(rng, n * d);
  // The borrowed segment's keys live in another buffer.
  const std::vector<float> lender_keys(keys.begin() + 30 * d, keys.begin() + 80 * d);
  const std::vector<KeySegment> segments = {{keys.data(), 30, nullptr},
                                            {lender_keys.data(), 50, lender_q.data()},
                                            {keys.data() + 80 * d, 40, nullptr}};
  std::vector<int32_t> indices;
  for (int32_t e = 25; e < 35; ++e) indices.push_back(e);    // crosses 30
  for (int32_t e = 76; e < 90; ++e) indices.push_back(e);    // crosses 80
  for (int32_t e = 100; e < 120; ++e) indices.push_back(e);  // ends at the last row
  indices.push_back(3);
  const auto m = static_cast<int64_t>(indices.size());
  // Reference: each row's logit with its segment's query.
  std::vector<double> logits(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) {
    const int32_t row = indices[static_cast<size_t>(j)];
    const float* query = row >= 30 && row < 80 ? lender_q.data() : q.data();
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += double{query[c]} * keys[static_cast<size_t>(row * d + c)];
    logits[static_cast<size_t>(j)] = dot / std::sqrt(double{d});
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (double& x : logits) total += (x = std::exp(x - top));
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> out(d, NAN), probs(m, NAN);
    attention_decode_gathered_segments(isa, q.data(), segments, values.data(), nullptr, indices, d,
                                       out.data(), probs.data());
    for (int64_t j = 0; j < m; ++j)
      ASSERT_NEAR(probs[j], logits[static_cast<size_t>(j)] / total, 1e-6);
    for (int c = 0; c < d; ++c) {
      double expected = 0.0;
      for (int64_t j = 0; j < m; ++j)
        expected += logits[static_cast<size_t>(j)] / total *
                    values[static_cast<size_t>(indices[static_cast<size_t>(j)] * d + c)];
      ASSERT_NEAR(out[c], expected, kAttentionTolerance);
    }
  }
}

// Rows [n, d] stored as `type` (a KV cache type): the bytes, and the F32 values they stand for.
struct TypedRows {
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};
TypedRows store_as(DType type, const std::vector<float>& rows) {
  const auto n = static_cast<int64_t>(rows.size());
  TypedRows out{std::vector<uint8_t>(dtype_row_bytes(type, n)), std::vector<float>(rows.size())};
  quantize_row(type, rows.data(), out.bytes.data(), n);
  dequantize_row(type, out.bytes.data(), out.floats.data(), n);
  return out;
}

// A quantised KV cache (--cache-type-k/-v): the decode kernels read typed key and value rows
// (expanded block by block in cache) and must compute what the reference computes on the values
// those rows stand for: dense over several blocks, gathered over runs and isolated rows, keys
// and values of different types, in every instruction set.
TEST(KernelsAttention, DecodeOverTypedCacheRowsEqualsTheReferenceOnTheirValues) {
  std::mt19937 rng(57);
  // Peaked rows (logits up to ~20 in F32 against the double reference): 1e-5 on a probability.
  constexpr double kProbTolerance = 1e-5;
  const std::vector<std::pair<DType, DType>> types = {
      {DType::F16, DType::F16},   {DType::BF16, DType::BF16}, {DType::Q8_0, DType::Q8_0},
      {DType::Q4_0, DType::Q4_0}, {DType::Q8_0, DType::F16},  {DType::F32, DType::Q4_0}};
  for (Isa isa : available_isas()) {
    for (const auto& [key_type, value_type] : types) {
      for (auto [n, d] : {std::pair<int64_t, int>{1, 32}, {37, 64}, {300, 96}, {1100, 64}}) {
        SCOPED_TRACE(::testing::Message() << isa_name(isa) << " K " << dtype_name(key_type) << " V "
                                          << dtype_name(value_type) << " n=" << n << " d=" << d);
        const int group = 4;
        const auto q = random_vector(rng, group * d, 2.0f);
        const TypedRows keys = store_as(key_type, random_vector(rng, n * d, 2.0f));
        const TypedRows values = store_as(value_type, random_vector(rng, n * d));
        const auto log_weights = random_vector(rng, n, 0.5f);
        const KeySegment segment{keys.bytes.data(), n, nullptr, key_type};
        const ValueRows value_rows(values.bytes.data(), value_type);
        std::vector<float> out(group * d, NAN), probs(group * n, NAN);
        attention_decode_group_segments(isa, q.data(), group, {&segment, 1}, value_rows,
                                        log_weights.data(), d, out.data(), probs.data());
        for (int h = 0; h < group; ++h) {
          std::vector<double> expected_probs;
          const auto expected =
              ref_decode_attention(q.data() + h * d, keys.floats.data(), values.floats.data(),
                                   log_weights.data(), n, d, &expected_probs);
          for (int i = 0; i < d; ++i)
            ASSERT_NEAR(out[h * d + i], expected[i], kAttentionTolerance) << "head " << h;
          for (int64_t j = 0; j < n; ++j)
            ASSERT_NEAR(probs[h * n + j], expected_probs[j], kProbTolerance) << "head " << h;
        }
        // Gathered: a long run (split into blocks), short runs and isolated rows, any order.
        std::vector<int32_t> indices;
        for (int64_t e = n / 3; e < n; e += (e % 5 == 0 ? 3 : 1))
          indices.push_back(static_cast<int32_t>(e));
        indices.push_back(0);
        const auto m = static_cast<int64_t>(indices.size());
        std::vector<float> sub_k, sub_v;
        for (int32_t i : indices) {
          sub_k.insert(sub_k.end(), keys.floats.begin() + i * d, keys.floats.begin() + (i + 1) * d);
          sub_v.insert(sub_v.end(), values.floats.begin() + i * d,
                       values.floats.begin() + (i + 1) * d);
        }
        std::vector<float> gathered(d, NAN), gathered_probs(m, NAN);
        attention_decode_gathered_segments(isa, q.data(), {&segment, 1}, value_rows, nullptr,
                                           indices, d, gathered.data(), gathered_probs.data());
        std::vector<double> expected_probs;
        const auto expected = ref_decode_attention(q.data(), sub_k.data(), sub_v.data(), nullptr, m,
                                                   d, &expected_probs);
        for (int i = 0; i < d; ++i) ASSERT_NEAR(gathered[i], expected[i], kAttentionTolerance);
        for (int64_t j = 0; j < m; ++j)
          ASSERT_NEAR(gathered_probs[j], expected_probs[static_cast<size_t>(j)], kProbTolerance);
      }
    }
  }
}

TEST(KernelsAttention, DecodeOverNoEntriesGivesZeros) {
  std::vector<float> q(8, 1.0f), out(8, NAN);
  attention_decode(q.data(), nullptr, nullptr, nullptr, 0, 8, out.data(), nullptr);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace protokv::kernels
