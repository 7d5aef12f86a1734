// SPDX-License-Identifier: Apache-2.0
// PoD (DESIGN §5 pod): shared keys in the cache, the segmented decode kernel, the
// press's layout and calibration, and the engine reading a block's lowest layer's keys.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_reference.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "press/calibration_measures.h"
#include "press/pod.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "test_engine_model.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

// --- kernel -------------------------------------------------------------------------------------

TEST(PodKernel, SegmentedDecodeEqualsDenseDecodeOnTheConcatenatedKeys) {
  std::mt19937 rng(41);
  for (kernels::Isa isa : kernels::available_isas()) {
    for (int group : {1, 4}) {
      for (auto [n, d] : {std::pair<int64_t, int>{3, 8}, {70, 64}, {301, 72}, {600, 130}}) {
        SCOPED_TRACE(::testing::Message()
                     << kernels::isa_name(isa) << " group=" << group << " n=" << n << " d=" << d);
        const auto q = testing::random_vector(rng, group * d, 2.0f);
        const auto keys = testing::random_vector(rng, n * d, 2.0f);
        const auto values = testing::random_vector(rng, n * d);
        const auto log_weights = testing::random_vector(rng, n, 0.5f);
        // Three segments of odd sizes (one may be empty), each from its own buffer.
        const int64_t a = std::min<int64_t>(n, 5), b = (n - a) / 2 + 1;
        const int64_t split[3] = {a, std::min(b, n - a), n - a - std::min(b, n - a)};
        std::vector<std::vector<float>> copies;
        std::vector<KeySegment> segments;
        int64_t first = 0;
        for (int64_t count : split) {
          copies.emplace_back(keys.begin() + first * d, keys.begin() + (first + count) * d);
          first += count;
        }
        for (size_t s = 0; s < 3; ++s) segments.push_back({copies[s].data(), split[s], nullptr});
        std::vector<float> dense(group * d), dense_probs(group * n), out(group * d, NAN),
            probs(group * n, NAN);
        kernels::attention_decode_group(isa, q.data(), group, keys.data(), values.data(),
                                        log_weights.data(), n, d, dense.data(), dense_probs.data());
        kernels::attention_decode_group_segments(isa, q.data(), group, segments, values.data(),
                                                 log_weights.data(), d, out.data(), probs.data());
        for (int h = 0; h < group; ++h) {
          const auto expected = testing::ref_decode_attention(
              q.data() + h * d, keys.data(), values.data(), log_weights.data(), n, d, nullptr);
          for (int i = 0; i < d; ++i) {
            ASSERT_NEAR(out[h * d + i], dense[h * d + i], 1e-5);
            ASSERT_NEAR(out[h * d + i], expected[static_cast<size_t>(i)], 2e-5);
          }
        }
        for (int64_t j = 0; j < group * n; ++j) ASSERT_NEAR(probs[j], dense_probs[j], 1e-6);
      }
    }
  }
}

TEST(PodKernel, OneSegmentIsBitIdenticalToTheDenseKernel) {
  std::mt19937 rng(42);
  const int64_t n = 333;
  const int d = 64, group = 2;
  const auto q = testing::random_vector(rng, group * d, 2.0f);
  const auto keys = testing::random_vector(rng, n * d, 2.0f);
  const auto values = testing::random_vector(rng, n * d);
  std::vector<float> dense(group * d), out(group * d);
  kernels::attention_decode_group(q.data(), group, keys.data(), values.data(), nullptr, n, d,
                                  dense.data(), nullptr);
  const KeySegment all{keys.data(), n, nullptr};
  kernels::attention_decode_group_segments(q.data(), group, {&all, 1}, values.data(), nullptr, d,
                                           out.data(), nullptr);
  EXPECT_EQ(out, dense);
}

TEST(PodKernel, ASegmentWithItsOwnQueryUsesItForItsLogits) {
  // scores=lower (PoD Eq. 3): the borrowed segment's logits use the lower layer's query.
  std::mt19937 rng(44);
  const int64_t n = 70;
  const int d = 16, group = 2;
  const auto q = testing::random_vector(rng, group * d, 2.0f);
  const auto lower_q = testing::random_vector(rng, group * d, 2.0f);
  const auto keys = testing::random_vector(rng, n * d, 2.0f);
  const auto values = testing::random_vector(rng, n * d);
  const std::vector<KeySegment> segments = {{keys.data(), 10, nullptr},
                                            {keys.data() + 10 * d, 45, lower_q.data()},
                                            {keys.data() + 55 * d, 15, nullptr}};
  for (kernels::Isa isa : kernels::available_isas()) {
    std::vector<float> out(group * d), probs(group * n);
    kernels::attention_decode_group_segments(isa, q.data(), group, segments, values.data(), nullptr,
                                             d, out.data(), probs.data());
    for (int h = 0; h < group; ++h) {
      std::vector<double> logits(n);
      for (int64_t j = 0; j < n; ++j) {
        const float* query = (j >= 10 && j < 55 ? lower_q.data() : q.data()) + h * d;
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += double(query[c]) * keys[j * d + c];
        logits[j] = dot / std::sqrt(double(d));
      }
      const double top = *std::max_element(logits.begin(), logits.end());
      double total = 0.0;
      for (double& x : logits) total += (x = std::exp(x - top));
      for (int c = 0; c < d; ++c) {
        double expected = 0.0;
        for (int64_t j = 0; j < n; ++j) expected += logits[j] / total * values[j * d + c];
        EXPECT_NEAR(out[h * d + c], expected, 2e-5) << kernels::isa_name(isa);
      }
      // The gathered variant, one query head, every entry: the same.
      std::vector<int32_t> all(n);
      for (int32_t e = 0; e < n; ++e) all[static_cast<size_t>(e)] = e;
      std::vector<KeySegment> one_head = segments;
      one_head[1].query = lower_q.data() + h * d;
      std::vector<float> gathered(d);
      kernels::attention_decode_gathered_segments(isa, q.data() + h * d, one_head, values.data(),
                                                  nullptr, all, d, gathered.data(), nullptr);
      for (int c = 0; c < d; ++c) EXPECT_NEAR(gathered[c], out[h * d + c], 1e-5);
    }
  }
}

TEST(PodKernel, GatheredSegmentsEqualGatheredOnTheConcatenatedKeys) {
  std::mt19937 rng(43);
  for (kernels::Isa isa : kernels::available_isas()) {
    const int64_t n = 90;
    const int d = 24;
    const auto q = testing::random_vector(rng, d, 2.0f);
    const auto keys = testing::random_vector(rng, n * d, 2.0f);
    const auto values = testing::random_vector(rng, n * d);
    const std::vector<KeySegment> segments = {{keys.data(), 16, nullptr},
                                              {keys.data() + 16 * d, 50, nullptr},
                                              {keys.data() + 66 * d, 24, nullptr}};
    std::vector<int32_t> indices;
    for (int32_t e = 0; e < n; e += 3) indices.push_back(e);
    std::vector<float> dense(d), out(d), dense_probs(indices.size()), probs(indices.size());
    kernels::attention_decode_gathered(isa, q.data(), keys.data(), values.data(), nullptr, indices,
                                       d, dense.data(), dense_probs.data());
    kernels::attention_decode_gathered_segments(isa, q.data(), segments, values.data(), nullptr,
                                                indices, d, out.data(), probs.data());
    EXPECT_EQ(out, dense) << kernels::isa_name(isa);
    EXPECT_EQ(probs, dense_probs) << kernels::isa_name(isa);
  }
}

// --- cache --------------------------------------------------------------------------------------

HeadCache filled_head(int64_t n, int d, float base) {
  HeadCache head(d);
  std::vector<float> k(static_cast<size_t>(d)), v(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    for (int c = 0; c < d; ++c) {
      k[static_cast<size_t>(c)] = base + static_cast<float>(t * 100 + c);
      v[static_cast<size_t>(c)] = -base - static_cast<float>(t * 100 + c);
    }
    head.append(k.data(), v.data(), static_cast<int32_t>(t));
  }
  return head;
}

// Concatenates a head's key segments.
std::vector<float> segment_keys(const HeadCache& head, const HeadCache& lender) {
  std::array<KeySegment, 3> segments;
  const int count = head.key_segments(lender, segments);
  std::vector<float> keys;
  for (int s = 0; s < count; ++s) {
    const KeySegment& segment = segments[static_cast<size_t>(s)];
    const size_t at = keys.size();
    keys.resize(at + static_cast<size_t>(segment.count * head.head_dim()));
    dequantize_row(segment.type, segment.keys, keys.data() + at, segment.count * head.head_dim());
  }
  return keys;
}

TEST(PodCache, SharedKeysComeFromTheLenderAndTheBytesShrinkByExactlyTheDroppedKeys) {
  const int d = 4;
  const int64_t n = 30;
  const HeadCache lender = filled_head(n, d, 0.5f);
  HeadCache head = filled_head(n, d, 7.0f);
  const size_t full_bytes = head.kv_bytes();
  head.share_keys(0, 3, 20);
  EXPECT_TRUE(head.shares_keys());
  EXPECT_EQ(head.key_lender(), 0);
  EXPECT_EQ(head.kv_bytes(), full_bytes - 17 * d * sizeof(float));
  EXPECT_EQ(head.size(), n);
  const std::vector<float> keys = segment_keys(head, lender);
  ASSERT_EQ(keys.size(), static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    const bool shared = t >= 3 && t < 20;
    EXPECT_EQ(head.key_is_shared(t), shared);
    const std::vector<float> expected = shared ? lender.key_floats(t) : head.key_floats(t);
    for (int c = 0; c < d; ++c) ASSERT_EQ(keys[static_cast<size_t>(t * d + c)], expected[c]);
    EXPECT_EQ(head.value_floats(t)[0], -7.0f - static_cast<float>(t * 100));  // values all stay
  }
  // Decode: tokens leave the recent window one by one; the segments follow, the released rows
  // go in batches and the reserve does not bring them back.
  HeadCache growing_lender = filled_head(n, d, 0.5f);
  std::vector<float> k(d), v(d);
  for (int64_t t = n; t < n + 200; ++t) {
    for (int c = 0; c < d; ++c) k[static_cast<size_t>(c)] = 7.0f + static_cast<float>(t * 100 + c);
    head.append(k.data(), v.data(), static_cast<int32_t>(t));
    growing_lender.append(k.data(), v.data(), static_cast<int32_t>(t));
    head.extend_shared_keys(head.size() - 10);
    const std::vector<float> now = segment_keys(head, growing_lender);
    ASSERT_EQ(now.size(), static_cast<size_t>(head.size() * d));
    for (int64_t e = head.size() - 10; e < head.size(); ++e)
      ASSERT_EQ(now[static_cast<size_t>(e * d)], 7.0f + static_cast<float>(e * 100)) << t;
    ASSERT_EQ(now[static_cast<size_t>((head.size() - 11) * d)],
              growing_lender.key_floats(head.size() - 11)[0]);
    // Held keys: 3 sinks + 10 recent + at most max(64, held / 8) rows awaiting release.
    const size_t held_keys = head.kv_bytes() / sizeof(float) / d - static_cast<size_t>(head.size());
    ASSERT_GE(held_keys, 13u);
    ASSERT_LE(held_keys, 13u + 64u);
  }
  head.reserve(head.size() + 100);
  EXPECT_LE(head.capacity_bytes(),
            static_cast<size_t>((head.size() + 100) * d * 4 * 2 + (13 + 64 + 100) * d * 4));
}

TEST(PodCache, BadSharingIsAnError) {
  HeadCache head = filled_head(10, 2, 0.0f);
  EXPECT_THROW(head.share_keys(0, 5, 11), Error);
  EXPECT_THROW(head.share_keys(-1, 1, 2), Error);
  EXPECT_THROW(head.extend_shared_keys(3), Error);  // shares nothing yet
  head.share_keys(0, 2, 5);
  EXPECT_THROW(head.share_keys(0, 6, 7), Error);
  EXPECT_THROW(head.extend_shared_keys(4), Error);  // shrinking
  const std::vector<int32_t> some = {0, 1};
  EXPECT_THROW(head.keep(some), Error);
  std::array<KeySegment, 3> segments;
  const HeadCache short_lender = filled_head(3, 2, 0.0f);
  EXPECT_THROW(head.key_segments(short_lender, segments), Error);
}

// --- press --------------------------------------------------------------------------------------

std::unique_ptr<press::PodPress> pod_with_table(std::vector<std::vector<int>> table,
                                                int64_t sinks = 16) {
  press::PodOptions options;
  options.sinks = sinks;
  options.block_start = std::move(table);
  return std::make_unique<press::PodPress>(options);
}

TEST(PodPress, UpperLayerReadsTheLowerLayersKeysForDistantTokensAndItsOwnForProximal) {
  constexpr int64_t kTokens = 120, kBudget = 40, kSinks = 16;
  constexpr int kHeads = 4, kKvHeads = 2, kDim = 8;
  // KV head 0: layers 0-1 one block; KV head 1: each layer its own block.
  auto pod = pod_with_table({{0, 0}, {0, 1}});
  SyntheticLayer layer0(kTokens, kHeads, kKvHeads, kDim), layer1(kTokens, kHeads, kKvHeads, kDim);
  layer0.n_layers = layer1.n_layers = 2;
  layer1.layer = 1;
  layer0.fill_random(1);
  layer1.fill_random(2);
  pod->begin(layer0.info(), testing::entries(kBudget));
  KvCache cache(2, kKvHeads, kDim);
  pod->compress_prefill(layer0.view(), cache.layer(0));
  pod->compress_prefill(layer1.view(), cache.layer(1));
  const HeadCache& upper = cache.layer(1).heads[0];
  EXPECT_EQ(upper.shared_begin(), kSinks);
  EXPECT_EQ(upper.shared_end(), kTokens - (kBudget - kSinks));
  EXPECT_FALSE(cache.layer(1).heads[1].shares_keys());
  EXPECT_FALSE(cache.layer(0).heads[0].shares_keys());
  // Bytes: values of every token everywhere; keys of every token except the distant ones of
  // layer 1 head 0, which keeps B keys.
  const size_t row = kDim * sizeof(float);
  EXPECT_EQ(cache.kv_bytes(), (4 * kTokens * 2 - kTokens + kBudget) * row);

  // Decode attention of layer 1's query heads 0 and 1 (KV head 0) against a naive computation
  // over the keys the paper's layout gives: layer 0's for distant tokens, layer 1's otherwise.
  std::mt19937 rng(5);
  const auto q = testing::random_vector(rng, 2 * kDim, 2.0f);
  std::array<KeySegment, 3> segments;
  const int count = upper.key_segments(cache.layer(0).heads[0], segments);
  std::vector<float> out(2 * kDim);
  kernels::attention_decode_group_segments(q.data(), 2, {segments.data(), size_t(count)},
                                           testing::cache_values(upper).data(), nullptr, kDim,
                                           out.data(), nullptr);
  std::vector<float> naive_keys;
  for (int64_t t = 0; t < kTokens; ++t) {
    const bool distant = t >= kSinks && t < kTokens - (kBudget - kSinks);
    const float* k = (distant ? layer0 : layer1).key(0, t);
    naive_keys.insert(naive_keys.end(), k, k + kDim);
  }
  for (int h = 0; h < 2; ++h) {
    const auto expected = testing::ref_decode_attention(
        q.data() + h * kDim, naive_keys.data(), layer1.v.data(), nullptr, kTokens, kDim, nullptr);
    for (int c = 0; c < kDim; ++c) EXPECT_NEAR(out[h * kDim + c], expected[c], 2e-5);
  }
}

TEST(PodPress, CalibratesBlocksOnThePromptWithAlgorithmOne) {
  constexpr int64_t kTokens = 64;
  constexpr int kHeads = 4, kKvHeads = 2, kDim = 8, kLayers = 4;
  // Layers 0, 1 and 3 share the same tensors (identical attention); layer 2 differs.
  std::vector<SyntheticLayer> layers;
  for (int l = 0; l < kLayers; ++l) {
    layers.emplace_back(kTokens, kHeads, kKvHeads, kDim);
    layers.back().fill_random(l == 2 ? 99 : 7, 3.0f);
    layers.back().layer = l;
    layers.back().n_layers = kLayers;
  }
  for (const double delta : {0.5, 0.0, 1.0}) {
    press::PodOptions options;
    options.delta = delta;
    options.queries = 8;
    press::PodPress pod(options);
    pod.begin(layers[0].info(), testing::entries(24));
    std::vector<std::vector<float>> rows[kLayers];
    for (int l = 0; l < kLayers; ++l) {
      LayerCache cache = layers[static_cast<size_t>(l)].empty_cache();
      pod.compress_prefill(layers[static_cast<size_t>(l)].view(), cache);
      for (int h = 0; h < kKvHeads; ++h)
        rows[l].push_back(
            press::last_query_attention_rows(layers[static_cast<size_t>(l)].view(), h, 8));
    }
    for (int h = 0; h < kKvHeads; ++h) {
      // The reference: pod_block_starts over the whole similarity matrix at once.
      const auto expected = press::pod_block_starts(
          kLayers,
          [&](int a, int b) {
            double total = 0.0;
            const int64_t per = 8 * kTokens;
            for (int g = 0; g < 2; ++g)
              total += press::attention_similarity(
                  std::span<const float>(rows[a][static_cast<size_t>(h)]).subspan(g * per, per),
                  std::span<const float>(rows[b][static_cast<size_t>(h)]).subspan(g * per, per), 8,
                  kTokens);
            return total / 2;
          },
          delta);
      EXPECT_EQ(pod.block_starts()[static_cast<size_t>(h)], expected) << "delta " << delta;
    }
    // delta 0: everything is similar enough; delta 1: only identical layers (0 and 1; 3 equals
    // them but follows 2) share a block.
    if (delta == 0.0) {
      EXPECT_EQ(pod.block_starts()[0], (std::vector<int>{0, 0, 0, 0}));
    }
    if (delta == 1.0) {
      EXPECT_EQ(pod.block_starts()[1], (std::vector<int>{0, 0, 2, 3}));
    }
  }
}

TEST(PodPress, AttentionRowsAreCausalDistributions) {
  SyntheticLayer layer(20, 2, 1, 4);
  layer.fill_random(3);
  const auto rows = press::last_query_attention_rows(layer.view(), 0, 5);
  ASSERT_EQ(rows.size(), 2u * 5 * 20);
  for (int r = 0; r < 10; ++r) {
    double sum = 0.0;
    for (int j = 0; j < 20; ++j) sum += rows[static_cast<size_t>(r * 20 + j)];
    EXPECT_NEAR(sum, 1.0, 1e-5);
    const int position = 15 + r % 5;
    for (int j = position + 1; j < 20; ++j) EXPECT_EQ(rows[static_cast<size_t>(r * 20 + j)], 0.0f);
  }
}

TEST(PodPress, BadOptionsAndTablesAreOneLineErrors) {
  for (const std::string spec : {"pod:sinks=-1", "pod:delta=1.5", "pod:queries=0", "pod:tau=1.5",
                                 "pod:tau=x", "pod:gate=1", "pod:scores=upper", "pod:tau_gate=own"})
    EXPECT_THROW(make_press(spec), Error) << spec;
  EXPECT_THROW(make_press("pod", "adakv"), Error);
  SyntheticLayer layer(100, 2, 1, 4);
  auto pod = make_press("pod");
  EXPECT_THROW(pod->begin(layer.info(), testing::entries(16)), Error);  // no recent token
  layer.n_layers = 3;
  for (const auto& table :
       std::vector<std::vector<std::vector<int>>>{{{0, 0}},                // too few layers
                                                  {{0, 0, 0}, {0, 1, 2}},  // too many heads
                                                  {{0, 0, 1}},     // 1 does not start a block
                                                  {{0, 1, 0}}}) {  // blocks are consecutive layers
    auto bad = pod_with_table(table);
    try {
      bad->begin(layer.info(), testing::entries(20));
      ADD_FAILURE() << "accepted a bad table";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

// --- engine -------------------------------------------------------------------------------------

testing::RandomModel pod_model() {
  testing::RandomModelSpec spec;
  spec.n_layers = 3;
  spec.context_length = 512;
  return testing::make_random_model(spec);
}

std::vector<int32_t> prompt_tokens(int64_t n, int vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % vocab);
  return tokens;
}

TEST(PodEngine, SingleLayerBlocksAreBitIdenticalToTheFullCache) {
  const testing::RandomModel model = pod_model();
  const ModelConfig& c = model.weights.config;
  const auto prompt = prompt_tokens(200, c.vocab_size);
  Session reference(model.weights);
  std::vector<std::vector<float>> expected;
  auto logits = reference.prefill(prompt);
  expected.emplace_back(logits.begin(), logits.end());
  for (int step = 0; step < 6; ++step) {
    logits = reference.decode(static_cast<int32_t>(step + 3));
    expected.emplace_back(logits.begin(), logits.end());
  }
  std::vector<std::vector<int>> singletons(static_cast<size_t>(c.n_kv_heads), {0, 1, 2});
  SessionOptions options;
  options.press = PressSpec::from_factory([singletons] { return pod_with_table(singletons); });
  options.budget.entries = 40;
  Session session(model.weights, options);
  logits = session.prefill(prompt);
  EXPECT_TRUE(std::equal(logits.begin(), logits.end(), expected[0].begin()));
  EXPECT_EQ(session.prefill_stats().kv_bytes, reference.prefill_stats().kv_bytes);
  for (int step = 0; step < 6; ++step) {
    logits = session.decode(static_cast<int32_t>(step + 3));
    ASSERT_TRUE(std::equal(logits.begin(), logits.end(), expected[step + 1].begin())) << step;
  }
}

// Checks, at every decode step and layer, that the engine's attention output of each query head
// equals a naive softmax over the keys PoD prescribes: the block's lowest layer's for distant
// entries, the layer's own for proximal ones; values always the layer's own.
class NaivePodObserver : public DecodeObserver {
 public:
  NaivePodObserver(const KvCache& cache, std::vector<std::vector<int>> blocks, int64_t sinks,
                   int64_t recent, bool lower_query)
      : cache_(cache),
        blocks_(std::move(blocks)),
        sinks_(sinks),
        recent_(recent),
        lower_query_(lower_query) {}
  void on_decode(const DecodeStep& step) override {
    const int n_kv = static_cast<int>(step.cache->heads.size());
    const int group = step.n_heads / n_kv;
    const int d = step.head_dim;
    // Layers come in order within a step: keep each one's queries for the layers above.
    queries_.resize(static_cast<size_t>(step.layer + 1));
    queries_[static_cast<size_t>(step.layer)].assign(step.q, step.q + step.n_heads * d);
    for (int kv = 0; kv < n_kv; ++kv) {
      const HeadCache& head = step.cache->heads[static_cast<size_t>(kv)];
      const int start = blocks_[static_cast<size_t>(kv)][static_cast<size_t>(step.layer)];
      const HeadCache& lower = cache_.layer(start).heads[static_cast<size_t>(kv)];
      const int64_t n = head.size();
      // Before the press's on_decode of this step: the newest token's predecessor window.
      const int64_t distant_end = start == step.layer ? sinks_ : n - 1 - recent_;
      for (int g = 0; g < group; ++g) {
        const int h = kv * group + g;
        // Naive: logits with this layer's query, or for distant entries with scores=lower the
        // block start's query; keys per PoD; one softmax; this layer's values.
        std::vector<double> logits(static_cast<size_t>(n));
        for (int64_t e = 0; e < n; ++e) {
          const bool distant = e >= sinks_ && e < distant_end;
          if (distant) {
            ++distant_reads;
            EXPECT_TRUE(head.key_is_shared(e));
          }
          const std::vector<float> k = distant ? lower.key_floats(e) : head.key_floats(e);
          const float* q =
              (distant && lower_query_ ? queries_[static_cast<size_t>(start)].data() : step.q) +
              h * d;
          double dot = 0.0;
          for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
          logits[static_cast<size_t>(e)] = dot / std::sqrt(static_cast<double>(d));
        }
        const double top = *std::max_element(logits.begin(), logits.end());
        double total = 0.0;
        for (double& x : logits) total += (x = std::exp(x - top));
        for (int c = 0; c < d; ++c) {
          double expected = 0.0;
          for (int64_t e = 0; e < n; ++e)
            expected += logits[static_cast<size_t>(e)] / total * head.value_floats(e)[c];
          EXPECT_NEAR(step.attention_output[h * d + c], expected, 2e-5);
        }
      }
    }
  }
  int64_t distant_reads = 0;

 private:
  const KvCache& cache_;
  std::vector<std::vector<int>> blocks_;
  int64_t sinks_, recent_;
  bool lower_query_;
  std::vector<std::vector<float>> queries_;  // [layer][n_heads * d] of the current step
};

class PodEngineScores : public ::testing::TestWithParam<bool> {};

TEST_P(PodEngineScores, DecodeReadsTheBlockStartsKeysForDistantTokensAndMemoryShrinks) {
  const bool lower_query = GetParam();
  const testing::RandomModel model = pod_model();
  const ModelConfig& c = model.weights.config;
  const int64_t n = 200, budget = 40, sinks = 16;
  const auto prompt = prompt_tokens(n, c.vocab_size);
  // KV head 0: all three layers one block; KV head 1: layers 1-2 one block.
  const std::vector<std::vector<int>> blocks = {{0, 0, 0}, {0, 1, 1}};
  press::PodOptions pod_options;
  pod_options.sinks = sinks;
  pod_options.block_start = blocks;
  pod_options.lower_query = lower_query;
  SessionOptions options;
  options.press = PressSpec::from_factory(
      [pod_options] { return std::make_unique<press::PodPress>(pod_options); });
  options.budget.entries = budget;
  Session session(model.weights, options);
  session.prefill(prompt);
  const size_t row = static_cast<size_t>(c.head_dim()) * sizeof(float);
  const size_t full = static_cast<size_t>(c.n_layers * c.n_kv_heads * n) * 2 * row;
  // Three heads (0 at layers 1 and 2, 1 at layer 2) drop n - B keys each.
  EXPECT_EQ(session.prefill_stats().kv_bytes, full - 3 * static_cast<size_t>(n - budget) * row);
  EXPECT_EQ(session.cache().kv_bytes(), session.prefill_stats().kv_bytes);
  NaivePodObserver observer(session.cache(), blocks, sinks, budget - sinks, lower_query);
  session.set_observer(&observer);
  for (int step = 0; step < 100; ++step) {
    const auto logits = session.decode(static_cast<int32_t>(step % c.vocab_size));
    for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(observer.distant_reads, 0);
  // After decode, the sharing heads still hold B keys (+ at most 64 rows awaiting release).
  for (int l = 0; l < c.n_layers; ++l)
    for (int kv = 0; kv < c.n_kv_heads; ++kv) {
      const HeadCache& head = session.cache().layer(l).heads[static_cast<size_t>(kv)];
      const size_t keys = head.kv_bytes() / row - static_cast<size_t>(head.size());
      if (blocks[static_cast<size_t>(kv)][static_cast<size_t>(l)] == l) {
        EXPECT_EQ(keys, static_cast<size_t>(head.size()));
      } else {
        EXPECT_EQ(head.shared_end(), head.size() - (budget - sinks));
        EXPECT_GE(keys, static_cast<size_t>(budget));
        EXPECT_LE(keys, static_cast<size_t>(budget + 64));
      }
    }
  // append() (a follow-up turn) works on a cache with shared keys.
  const std::vector<int32_t> more = {5, 6, 7};
  for (const float x : session.append(more)) ASSERT_TRUE(std::isfinite(x));
}

// scores=own (DESIGN: this layer's query with the lower layer's keys) and scores=lower (paper
// Eq. 3: the lower layer's query and keys).
INSTANTIATE_TEST_SUITE_P(Pod, PodEngineScores, ::testing::Bool());

// tau = 0: every gate is >= 0, so at the sharing layers every query head attends only the
// proximal entries (own keys), and the engine's output equals a naive softmax over them; the
// block's lowest layers still attend everything.
class ProximalOnlyObserver : public DecodeObserver {
 public:
  bool wants_probabilities() const override { return true; }
  void on_decode(const DecodeStep& step) override {
    const int n_kv = static_cast<int>(step.cache->heads.size());
    const int group = step.n_heads / n_kv;
    const int d = step.head_dim;
    for (int h = 0; h < step.n_heads; ++h) {
      const HeadCache& head = step.cache->heads[static_cast<size_t>(h / group)];
      std::vector<int32_t> expected_entries;
      std::vector<float> keys, values;
      for (int64_t e = 0; e < head.size(); ++e) {
        if (head.key_is_shared(e)) continue;
        expected_entries.push_back(static_cast<int32_t>(e));
        const std::vector<float> key = head.key_floats(e), value = head.value_floats(e);
        keys.insert(keys.end(), key.begin(), key.end());
        values.insert(values.end(), value.begin(), value.end());
      }
      if (head.shares_keys()) {
        ++skipped;
        const auto attended = step.attended(h);
        EXPECT_EQ(std::vector<int32_t>(attended.begin(), attended.end()), expected_entries);
      }
      const auto expected =
          testing::ref_decode_attention(step.q + h * d, keys.data(), values.data(), nullptr,
                                        static_cast<int64_t>(expected_entries.size()), d, nullptr);
      for (int c = 0; c < d; ++c)
        EXPECT_NEAR(step.attention_output[h * d + c], expected[static_cast<size_t>(c)], 2e-5);
    }
  }
  int64_t skipped = 0;
};

// A session of `model` whose KV head 0 shares layer 0's keys at layers 1-2 (budget 32: 16 sinks
// + 16 recent), with gate threshold `tau`, after a 150-token prompt.
std::unique_ptr<Session> gated_pod_session(const testing::RandomModel& model, double tau,
                                           bool gate_at_lowest) {
  press::PodOptions options;
  options.tau = tau;
  options.gate_at_lowest = gate_at_lowest;
  options.block_start = std::vector<std::vector<int>>{{0, 0, 0}, {0, 1, 2}};
  SessionOptions session_options;
  session_options.press =
      PressSpec::from_factory([options] { return std::make_unique<press::PodPress>(options); });
  session_options.budget.entries = 32;
  auto session = std::make_unique<Session>(model.weights, session_options);
  session->prefill(prompt_tokens(150, model.weights.config.vocab_size));
  return session;
}

TEST(PodEngine, GateThresholdZeroSkipsEveryDistantPartAtSharingLayers) {
  const testing::RandomModel model = pod_model();
  const std::unique_ptr<Session> owned = gated_pod_session(model, 0.0, false);
  Session& session = *owned;
  ProximalOnlyObserver observer;
  session.set_observer(&observer);
  for (int step = 0; step < 5; ++step) {
    session.decode(static_cast<int32_t>(step + 1));
    // Attended per query head: layer 0 all n entries; layers 1-2: KV head 0's two heads the 16
    // sinks + 17 recent, KV head 1's two heads all n. Reported per KV head's worth (/ group 2).
    const int64_t n = 150 + step + 1;
    const int64_t entries = (4 * n + 2 * (2 * 33 + 2 * n)) / 2;
    EXPECT_EQ(session.prefill_stats().decode_attended_kv_bytes,
              static_cast<size_t>(entries) * 16 * 2 * sizeof(float));
  }
  EXPECT_EQ(observer.skipped, 5 * 2 * 2);  // 5 steps, 2 layers, 2 query heads of KV head 0
  EXPECT_EQ(session.press()->config()["tau"], 0.0);
}

// One decode step of gated_pod_session() with `observer` watching it.
void decode_one_step_with_gate(double tau, bool gate_at_lowest, DecodeObserver& observer) {
  const testing::RandomModel model = pod_model();
  const std::unique_ptr<Session> owned = gated_pod_session(model, tau, gate_at_lowest);
  Session& session = *owned;
  session.set_observer(&observer);
  session.decode(7);
  EXPECT_EQ(session.press()->config()["tau_gate"], gate_at_lowest ? "lowest" : "layer");
}

// tau_gate=lowest: the gate is the attention share of the proximal entries at the block's lowest
// layer: the sinks and the last n_r + 1 entries, the newest token included. With tau between that
// share and the share of a window one entry shorter (or longer), the skip decision at the
// sharing layers tells the boundary: a window moved by one entry flips it.
class GateObserver : public DecodeObserver {
 public:
  bool wants_probabilities() const override { return true; }
  void on_decode(const DecodeStep& step) override {
    const int group = step.n_heads / static_cast<int>(step.cache->heads.size());
    for (int h = 0; h < step.n_heads; ++h) {
      const HeadCache& head = step.cache->heads[static_cast<size_t>(h / group)];
      if (step.layer == 0) {
        const auto p = step.probs(h);
        layer0_probs.emplace_back(p.begin(), p.end());
      } else if (step.layer == 1) {
        skipped.push_back(!step.attended(h).empty() &&
                          static_cast<int64_t>(step.attended(h).size()) < head.size());
      }
    }
  }
  std::vector<std::vector<float>> layer0_probs;  // [query head][entry], first step
  std::vector<bool> skipped;                     // [query head] at layer 1
};

TEST(PodEngine, TheGateCountsTheSinksAndTheLastRecentPlusOneEntries) {
  constexpr int64_t kSinks = 16, kRecent = 16;
  auto run = [&](double tau) {
    GateObserver observer;
    decode_one_step_with_gate(tau, /*gate_at_lowest=*/true, observer);
    return observer;
  };
  // The share of entries e < sinks or e >= n - window, as the press sums it.
  auto share = [&](const std::vector<float>& probs, int64_t window) {
    const auto n = static_cast<int64_t>(probs.size());
    double mass = 0.0;
    for (int64_t e = 0; e < n; ++e)
      if (e < kSinks || e >= n - window) mass += probs[static_cast<size_t>(e)];
    return static_cast<float>(mass);
  };
  const GateObserver probe = run(1.0);
  ASSERT_EQ(probe.layer0_probs.size(), 4u);
  ASSERT_EQ(probe.layer0_probs[0].size(), 151u);
  // Query heads 0 and 1 read KV head 0, which shares keys at layers 1-2.
  for (const int64_t wrong_window : {kRecent, kRecent + 2}) {
    SCOPED_TRACE(wrong_window);
    const float gate = share(probe.layer0_probs[0], kRecent + 1);
    const float wrong = share(probe.layer0_probs[0], wrong_window);
    ASSERT_GT(std::abs(gate - wrong), 1e-4f);
    const double tau = 0.5 * (static_cast<double>(gate) + wrong);
    const GateObserver gated = run(tau);
    ASSERT_EQ(gated.skipped.size(), 4u);
    for (int h = 0; h < 2; ++h)
      EXPECT_EQ(gated.skipped[static_cast<size_t>(h)],
                share(probe.layer0_probs[static_cast<size_t>(h)], kRecent + 1) >= tau)
          << "query head " << h;
    EXPECT_FALSE(gated.skipped[2]);  // KV head 1 shares no keys
    EXPECT_FALSE(gated.skipped[3]);
  }
}

// tau_gate=layer (default, PoD §2.3 with Eq. 4): a sharing layer's gate is its own,
// g = Σexp a^P / (Σexp a^P + Σexp a^D): a^P this layer's query on its own proximal keys, a^D the
// block's lowest layer's distant logits (scores=lower, Eq. 3). The observer recomputes both from
// the queries and keys naively; tau between this gate and the lowest layer's own proximal share
// makes the two rules disagree, and the skips follow this layer's gate.
class LayerGateObserver : public DecodeObserver {
 public:
  LayerGateObserver(int64_t sinks, int64_t recent) : sinks_(sinks), recent_(recent) {}
  bool wants_probabilities() const override { return true; }
  void on_decode(const DecodeStep& step) override {
    const int group = step.n_heads / static_cast<int>(step.cache->heads.size());
    const int d = step.head_dim;
    auto lse = [](const std::vector<double>& logits) {
      const double m = *std::max_element(logits.begin(), logits.end());
      double sum = 0.0;
      for (double x : logits) sum += std::exp(x - m);
      return m + std::log(sum);
    };
    for (int h = 0; h < group; ++h) {  // KV head 0 shares keys at layers 1-2
      const HeadCache& head = step.cache->heads[0];
      const float* q = step.q + h * d;
      const int64_t n = head.size();
      std::vector<double> logits;
      if (step.layer == 0) {
        double proximal = 0.0;
        const auto p = step.probs(h);
        for (int64_t e = 0; e < n; ++e) {
          const bool is_proximal = e < sinks_ || e >= n - 1 - recent_;
          if (is_proximal) proximal += p[static_cast<size_t>(e)];
          if (!is_proximal)
            logits.push_back(testing::ref_dot(q, head.key_floats(e).data(), d) / std::sqrt(d));
        }
        lowest_gate.push_back(proximal);
        distant_lse.push_back(lse(logits));
      } else if (step.layer == 1) {
        for (int64_t e = 0; e < n; ++e)
          if (!head.key_is_shared(e))
            logits.push_back(testing::ref_dot(q, head.key_floats(e).data(), d) / std::sqrt(d));
        layer_gate.push_back(1.0 /
                             (1.0 + std::exp(distant_lse[static_cast<size_t>(h)] - lse(logits))));
        skipped.push_back(static_cast<int64_t>(step.attended(h).size()) < n);
      }
    }
  }
  std::vector<double> lowest_gate, distant_lse, layer_gate;  // [query head of KV head 0]
  std::vector<bool> skipped;                                 // at layer 1

 private:
  int64_t sinks_, recent_;
};

TEST(PodEngine, TheGateOfASharingLayerIsItsOwnProximalMassAgainstTheLowestLayersDistantMass) {
  auto run = [&](double tau) {
    LayerGateObserver observer(/*sinks=*/16, /*recent=*/16);
    decode_one_step_with_gate(tau, /*gate_at_lowest=*/false, observer);
    return observer;
  };
  const LayerGateObserver probe = run(1.0);  // skips nothing; the first step's gates
  ASSERT_EQ(probe.layer_gate.size(), 2u);
  int disagreements = 0;
  for (int h = 0; h < 2; ++h) {
    SCOPED_TRACE(h);
    const double gate = probe.layer_gate[static_cast<size_t>(h)];
    const double lowest = probe.lowest_gate[static_cast<size_t>(h)];
    ASSERT_GT(std::abs(gate - lowest), 1e-3);  // the two rules are told apart
    for (const double tau : {0.5 * (gate + lowest), gate - 1e-4, gate + 1e-4}) {
      const LayerGateObserver gated = run(tau);
      ASSERT_EQ(gated.skipped.size(), 2u);
      EXPECT_EQ(gated.skipped[static_cast<size_t>(h)], gate >= tau) << "tau " << tau;
      disagreements += (gate >= tau) != (lowest >= tau);
    }
  }
  EXPECT_GE(disagreements, 2);
}

TEST(PodEngine, CalibratedOnThePromptGeneratesWithOneOrSeveralPrefillChunks) {
  const testing::RandomModel model = pod_model();
  const auto prompt = prompt_tokens(150, model.weights.config.vocab_size);
  const auto pod = PressSpec::parse("pod:delta=0");  // every head one block: the most sharing
  for (const int64_t ubatch : {int64_t{0}, int64_t{64}}) {
    SessionOptions options;
    options.press = pod;
    options.budget.entries = 32;
    options.ubatch = ubatch;
    Session session(model.weights, options);
    session.prefill(prompt);
    const ModelConfig& c = model.weights.config;
    const size_t row = static_cast<size_t>(c.head_dim()) * sizeof(float);
    EXPECT_EQ(session.cache().kv_bytes(),
              static_cast<size_t>(c.n_layers * c.n_kv_heads * 150 * 2) * row -
                  static_cast<size_t>((c.n_layers - 1) * c.n_kv_heads * (150 - 32)) * row);
    for (int step = 0; step < 4; ++step)
      for (const float x : session.decode(1)) ASSERT_TRUE(std::isfinite(x));
  }
}

}  // namespace
}  // namespace protokv
