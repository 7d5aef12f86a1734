// SPDX-License-Identifier: Apache-2.0
// The ragged KV cache (src/cache/kv_cache.cpp), head by head, on entries whose rows encode their
// token: entry t of a fresh head has key {t, t + 0.5}, value {-t, 10 t} and position 100 + t.
#include "protokv/kv_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "protokv/error.h"

namespace protokv {
namespace {

constexpr int kDim = 2;

HeadCache head_of(int n, int weighted = -1) {
  HeadCache head(kDim);
  for (int t = 0; t < n; ++t) {
    const std::vector<float> k = {float(t), float(t) + 0.5f}, v = {-float(t), 10.0f * t};
    head.append(k.data(), v.data(), 100 + t, t == weighted ? 0.25f : 0.0f);
  }
  return head;
}

// The F32 rows of a segment or a head of this file's F32 heads.
const float* floats(const KeySegment& segment) {
  EXPECT_EQ(segment.type, DType::F32);
  return static_cast<const float*>(segment.keys);
}
const float* floats(const HeadCache& head) {
  return static_cast<const float*>(head.key_rows());
}

// The tokens of the entries, read back from positions, keys and values (which must agree).
std::vector<int> tokens_of(const HeadCache& head) {
  std::vector<int> out;
  for (int64_t e = 0; e < head.size(); ++e) {
    const int t = head.positions()[static_cast<size_t>(e)] - 100;
    if (!head.key_is_shared(e)) {
      EXPECT_EQ(head.key_floats(e)[0], float(t));
      EXPECT_EQ(head.key_floats(e)[1], float(t) + 0.5f);
    }
    EXPECT_EQ(head.value_floats(e)[0], -float(t));
    EXPECT_EQ(head.value_floats(e)[1], 10.0f * t);
    out.push_back(t);
  }
  return out;
}

TEST(HeadCache, AppendKeepAndBytes) {
  HeadCache head = head_of(5, 3);
  EXPECT_EQ(head.size(), 5);
  EXPECT_TRUE(head.has_log_weights());
  EXPECT_EQ(head.kv_bytes(), 5u * kDim * 2 * sizeof(float));
  EXPECT_EQ(head.meta_bytes(), 5u * (sizeof(int32_t) + sizeof(float)));
  head.keep(std::vector<int32_t>{4, 1, 2});  // any order, kept as given
  EXPECT_EQ(tokens_of(head), (std::vector<int>{4, 1, 2}));
  EXPECT_FALSE(head.has_log_weights());  // entry 3, the weighted one, went
  EXPECT_EQ(head.kv_bytes(), 3u * kDim * 2 * sizeof(float));
  head.clear();
  EXPECT_TRUE(head.empty());
  EXPECT_EQ(head.kv_bytes(), 0u);
}

TEST(HeadCache, AssignRowsTakesRowsOfALayerTensor) {
  const std::vector<float> keys = {0, 0.5f, 1, 1.5f, 2, 2.5f}, values = {0, 0, -1, 10, -2, 20};
  const std::vector<int32_t> positions = {100, 101, 102};
  HeadCache head = head_of(1, 0);
  head.assign_rows(keys.data(), values.data(), positions.data(), std::vector<int32_t>{2, 0});
  EXPECT_EQ(tokens_of(head), (std::vector<int>{2, 0}));
  EXPECT_FALSE(head.has_log_weights());
  EXPECT_EQ(head.log_weights().size(), 2u);
}

TEST(HeadCache, ReorderPermutesRowsPositionsAndWeightsInPlace) {
  HeadCache head = head_of(6, 4);
  const void* keys_before = head.key_rows();
  head.reorder(2, std::vector<int32_t>{2, 0, 3, 1});  // entries 2..5 become 4, 2, 5, 3
  EXPECT_EQ(head.key_rows(), keys_before);            // in place
  const std::vector<int32_t> expected = {100, 101, 104, 102, 105, 103};
  EXPECT_EQ(std::vector<int32_t>(head.positions().begin(), head.positions().end()), expected);
  for (int64_t e = 0; e < 6; ++e) {
    const float t = static_cast<float>(expected[static_cast<size_t>(e)] - 100);
    EXPECT_EQ(head.key_floats(e)[0], t);
    EXPECT_EQ(head.key_floats(e)[1], t + 0.5f);
    EXPECT_EQ(head.value_floats(e)[0], -t);
    EXPECT_EQ(head.value_floats(e)[1], 10.0f * t);
    EXPECT_EQ(head.log_weights()[static_cast<size_t>(e)], t == 4 ? 0.25f : 0.0f);
  }
  EXPECT_THROW(head.reorder(3, std::vector<int32_t>{0, 1, 2, 3}), Error);  // past the end
  EXPECT_THROW(head.reorder(0, std::vector<int32_t>{0, 0}), Error);        // not a permutation
  EXPECT_THROW(head.reorder(0, std::vector<int32_t>{0, 2}), Error);
}

TEST(HeadCache, CompactKeepsAscendingEntriesInPlace) {
  HeadCache head = head_of(6, 4);
  const void* keys_before = head.key_rows();
  head.compact(std::vector<int32_t>{1, 4, 5});
  EXPECT_EQ(head.key_rows(), keys_before);  // no reallocation
  EXPECT_EQ(tokens_of(head), (std::vector<int>{1, 4, 5}));
  EXPECT_TRUE(head.has_log_weights());
  EXPECT_EQ(head.log_weights()[1], 0.25f);
  // A rejected call leaves the head as it was.
  EXPECT_THROW(head.compact(std::vector<int32_t>{2, 1}), Error);  // not ascending
  EXPECT_THROW(head.compact(std::vector<int32_t>{0, 3}), Error);  // out of range
  EXPECT_EQ(tokens_of(head), (std::vector<int>{1, 4, 5}));
}

TEST(HeadCache, DropPositionsBeforeAWindow) {
  HeadCache head = head_of(6);
  head.keep(std::vector<int32_t>{5, 0, 3, 1});
  EXPECT_EQ(head.drop_positions_before(103), 2);  // tokens 0 and 1
  EXPECT_EQ(tokens_of(head), (std::vector<int>{5, 3}));
  EXPECT_EQ(head.drop_positions_before(103), 0);
}

TEST(HeadCache, SharedKeysAreReadFromTheLenderAsThreeSegments) {
  const HeadCache lender = head_of(6);
  HeadCache head = head_of(6);
  head.share_keys(/*lender=*/0, 2, 4);
  EXPECT_TRUE(head.shares_keys());
  EXPECT_EQ(head.key_lender(), 0);
  EXPECT_EQ(head.kv_bytes(), (4u + 6u) * kDim * sizeof(float));  // 2 keys fewer
  EXPECT_EQ(tokens_of(head), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  std::array<KeySegment, 3> segments;
  const float query[kDim] = {1, 1};
  ASSERT_EQ(head.key_segments(lender, segments, query), 3);
  EXPECT_EQ(segments[0].count, 2);
  EXPECT_EQ(floats(segments[0])[2], 1.0f);  // held: tokens 0, 1
  EXPECT_EQ(segments[1].count, 2);
  EXPECT_EQ(segments[1].keys, floats(lender) + 2 * kDim);  // borrowed: tokens 2, 3
  EXPECT_EQ(segments[1].query, nullptr);  // the head did not ask for the lender's query
  EXPECT_EQ(segments[2].count, 2);
  EXPECT_EQ(floats(segments[2])[0], 4.0f);  // held: tokens 4, 5
  // Decode: tokens leaving a recent window join the shared range (released in batches).
  head.extend_shared_keys(5);
  ASSERT_EQ(head.key_segments(lender, segments), 3);
  EXPECT_EQ(segments[1].count, 3);
  EXPECT_EQ(segments[2].count, 1);
  EXPECT_EQ(floats(segments[2])[0], 5.0f);
  EXPECT_THROW(head.extend_shared_keys(4), Error);  // shrinking
  EXPECT_THROW(head.keep(std::vector<int32_t>{0}), Error);
  EXPECT_THROW(head.share_keys(0, 0, 1), Error);  // shares already
  // A lender too short, or sharing keys itself, cannot lend.
  EXPECT_THROW(head.key_segments(head_of(3), segments), Error);
  EXPECT_THROW(head.key_segments(head, segments), Error);
}

TEST(HeadCache, LenderQueryGoesWithTheBorrowedSegmentOnly) {
  const HeadCache lender = head_of(4);
  HeadCache head = head_of(4);
  head.share_keys(0, 0, 4, /*lender_query=*/true);
  EXPECT_TRUE(head.uses_lender_query());
  std::array<KeySegment, 3> segments;
  const float query[kDim] = {1, 1};
  ASSERT_EQ(head.key_segments(lender, segments, query), 1);
  EXPECT_EQ(segments[0].keys, lender.key_rows());
  EXPECT_EQ(segments[0].count, 4);
  EXPECT_EQ(segments[0].query, query);
  EXPECT_EQ(head.kv_bytes(), 4u * kDim * sizeof(float));  // values only
  EXPECT_THROW(head_of(2).share_keys(0, 1, 3), Error);    // past the end
}

TEST(KvCache, TotalsOverLayersAndHeads) {
  KvCache cache(3, 2, kDim);
  EXPECT_EQ(cache.n_layers(), 3);
  EXPECT_EQ(cache.n_kv_heads(), 2);
  cache.layer(1).heads[0] = head_of(4);
  cache.layer(2).heads[1] = head_of(2);
  EXPECT_EQ(cache.total_entries(), 6);
  EXPECT_EQ(cache.kv_bytes(), 6u * kDim * 2 * sizeof(float));
  EXPECT_EQ(cache.meta_bytes(), 6u * (sizeof(int32_t) + sizeof(float)));
  EXPECT_EQ(cache.layer(1).kv_bytes(), 4u * kDim * 2 * sizeof(float));
  cache.clear();
  EXPECT_EQ(cache.total_entries(), 0);
  EXPECT_EQ(cache.n_layers(), 3);
}

// A row as a cache of `type` reads it back as a key (rotated where the type rotates keys).
std::vector<float> stored(DType type, std::vector<float> row) {
  const int width = static_cast<int>(row.size());
  round_trip_to_cache_type(type, key_rotation_width(KvCacheType{type, DType::F32}, width),
                           row.data(), 1, width);
  return row;
}

// Typed heads (--cache-type-k/-v): rows are stored in their types' blocks, read back as their
// round trip, and keep / reorder / compact / share move whole typed rows; kv_bytes counts them.
TEST(HeadCache, TypedRowsReadBackAsTheirRoundTripAndMoveWhole) {
  constexpr int kWidth = 64;
  for (const DType type : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(dtype_name(type));
    HeadCache head(kWidth, {type, DType::F32});
    std::vector<std::vector<float>> keys, values;
    for (int t = 0; t < 6; ++t) {
      std::vector<float> k(kWidth), v(kWidth);
      for (int c = 0; c < kWidth; ++c) {
        k[static_cast<size_t>(c)] = std::sin(0.7f * static_cast<float>(t * kWidth + c)) * (1 + t);
        v[static_cast<size_t>(c)] = std::cos(0.3f * static_cast<float>(t * kWidth + c));
      }
      head.append(k.data(), v.data(), 100 + t);
      keys.push_back(stored(type, k));
      EXPECT_NE(keys.back(), k);  // every one of these types rounds these values
      values.push_back(v);        // values stay F32
    }
    EXPECT_EQ(head.kv_bytes(), 6 * (dtype_row_bytes(type, kWidth) + kWidth * sizeof(float)));
    const auto expect_rows = [&](const std::vector<int>& tokens) {
      ASSERT_EQ(head.size(), static_cast<int64_t>(tokens.size()));
      for (size_t e = 0; e < tokens.size(); ++e) {
        EXPECT_EQ(head.key_floats(static_cast<int64_t>(e)), keys[static_cast<size_t>(tokens[e])]);
        EXPECT_EQ(head.value_floats(static_cast<int64_t>(e)),
                  values[static_cast<size_t>(tokens[e])]);
        EXPECT_EQ(head.positions()[e], 100 + tokens[e]);
      }
    };
    expect_rows({0, 1, 2, 3, 4, 5});
    head.reorder(1, std::vector<int32_t>{2, 0, 1});
    expect_rows({0, 3, 1, 2, 4, 5});
    head.compact(std::vector<int32_t>{0, 2, 4, 5});
    expect_rows({0, 1, 4, 5});
    head.keep(std::vector<int32_t>{3, 0, 2});
    expect_rows({5, 0, 4});
    // A merging press writes a mean back: stored in the type.
    std::vector<float> mean(kWidth, 0.25f);
    mean[7] = -3.0f;
    head.write_key(1, mean.data());
    EXPECT_EQ(head.key_floats(1), stored(type, mean));
    EXPECT_THROW(head.write_key(3, mean.data()), Error);
    // Shared keys hand the kernels typed segments.
    const HeadCache lender = head;
    head.share_keys(0, 1, 2);
    std::array<KeySegment, 3> segments;
    ASSERT_EQ(head.key_segments(lender, segments), 3);
    for (const KeySegment& segment : segments) EXPECT_EQ(segment.type, type);
    EXPECT_EQ(head.kv_bytes(), 2 * dtype_row_bytes(type, kWidth) + 3 * kWidth * sizeof(float));
    EXPECT_THROW(head.read_keys(0, 2, mean.data()), Error);  // entry 1's key is the lender's
  }
}

// llama.cpp's rotation matrix (ggml_gen_hadamard in src/llama-kv-cache.cpp), built the same way.
std::vector<float> llama_cpp_hadamard(int n) {
  std::vector<float> h(static_cast<size_t>(n * n));
  h[0] = 1.0f / std::sqrt(static_cast<float>(n));
  for (int s = 1; s < n; s *= 2)
    for (int i = 0; i < s; ++i)
      for (int j = 0; j < s; ++j) {
        const float value = h[static_cast<size_t>(i * n + j)];
        h[static_cast<size_t>((i + s) * n + j)] = value;
        h[static_cast<size_t>(i * n + j + s)] = value;
        h[static_cast<size_t>((i + s) * n + j + s)] = -value;
      }
  return h;
}

// hadamard_rows multiplies each slice by llama.cpp's matrix (to F32 rounding) and is its own
// inverse; a head of 192 rotates its three 64-wide slices apart.
TEST(KvCacheHadamard, RotationIsLlamaCppsOrthonormalMatrix) {
  for (const int width : {64, 128, 256}) {
    SCOPED_TRACE(width);
    const auto h = llama_cpp_hadamard(width);
    std::vector<float> x(static_cast<size_t>(width));
    for (int i = 0; i < width; ++i)
      x[static_cast<size_t>(i)] = std::sin(1.3f * i) + (i == 5 ? 9.0f : 0.0f);
    std::vector<float> y = x;
    hadamard_rows(y.data(), 1, width, width);
    for (int i = 0; i < width; ++i) {
      double expected = 0.0, magnitude = 0.0;
      for (int j = 0; j < width; ++j) {
        expected +=
            static_cast<double>(h[static_cast<size_t>(i * width + j)]) * x[static_cast<size_t>(j)];
        magnitude += std::fabs(x[static_cast<size_t>(j)]);
      }
      ASSERT_NEAR(y[static_cast<size_t>(i)], expected, 1e-6 * magnitude) << i;
    }
    hadamard_rows(y.data(), 1, width, width);
    for (int i = 0; i < width; ++i)
      ASSERT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-5) << i;
  }
  std::vector<float> row(192);
  for (int i = 0; i < 192; ++i) row[static_cast<size_t>(i)] = static_cast<float>(i % 7) - 3.0f;
  std::vector<float> slices = row;
  hadamard_rows(slices.data(), 1, 192, 64);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> slice(row.begin() + 64 * s, row.begin() + 64 * (s + 1));
    hadamard_rows(slice.data(), 1, 64, 64);
    for (int i = 0; i < 64; ++i)
      EXPECT_EQ(slices[static_cast<size_t>(64 * s + i)], slice[static_cast<size_t>(i)]);
  }
}

// As llama.cpp: quantised types only, heads divisible by 64; keys in the largest power-of-two
// slice dividing the head, values in slices of 64.
TEST(KvCacheHadamard, WidthsFollowLlamaCpp) {
  const KvCacheType q4{DType::Q4_0, DType::Q8_0};
  EXPECT_EQ(key_rotation_width(q4, 64), 64);
  EXPECT_EQ(key_rotation_width(q4, 128), 128);
  EXPECT_EQ(key_rotation_width(q4, 256), 256);
  EXPECT_EQ(key_rotation_width(q4, 192), 64);
  EXPECT_EQ(key_rotation_width(q4, 96), 0);
  EXPECT_EQ(key_rotation_width(q4, 32), 0);
  EXPECT_EQ(value_rotation_width(q4, 256), 64);
  EXPECT_EQ(key_rotation_width({DType::F16, DType::BF16}, 128), 0);
  EXPECT_EQ(value_rotation_width({DType::F16, DType::BF16}, 128), 0);
  EXPECT_EQ(key_rotation_width({DType::Q4_0, DType::Q4_0, false}, 128), 0);
  EXPECT_EQ(value_rotation_width({DType::Q4_0, DType::Q4_0, false}, 128), 0);
}

// A rotating head stores the quantised H k (the bytes quantize_row gives for H k) and reads back
// H dequant(stored): its rows are the rotated round trip, not the plain one. (Which of the two
// loses less depends on the rows: one huge channel alone is kept better unrotated, a head whose
// blocks all hold a few large channels rotated; on SmolLM2's keys the rotation is far better,
// docs/results/kv_cache_types.md.)
TEST(KvCacheHadamard, HeadsStoreRotatedRowsAndReadThemBackUnrotated) {
  constexpr int kWidth = 128;
  std::vector<float> key(kWidth), value(kWidth);
  for (int c = 0; c < kWidth; ++c) {
    key[static_cast<size_t>(c)] = 0.3f * std::sin(0.9f * c);
    value[static_cast<size_t>(c)] = 0.2f * std::cos(0.4f * c);
  }
  key[5] = 40.0f;
  HeadCache rotating(kWidth, {DType::Q4_0, DType::Q4_0});
  HeadCache plain(kWidth, {DType::Q4_0, DType::Q4_0, false});
  ASSERT_EQ(rotating.key_rotation(), 128);
  ASSERT_EQ(rotating.value_rotation(), 64);
  ASSERT_EQ(plain.key_rotation(), 0);
  rotating.append(key.data(), value.data(), 0);
  plain.append(key.data(), value.data(), 0);
  std::vector<float> rotated = key;
  hadamard_rows(rotated.data(), 1, kWidth, 128);
  std::vector<uint8_t> expected_bytes(dtype_row_bytes(DType::Q4_0, kWidth));
  quantize_row(DType::Q4_0, rotated.data(), expected_bytes.data(), kWidth);
  EXPECT_EQ(std::memcmp(rotating.key_rows(), expected_bytes.data(), expected_bytes.size()), 0);
  std::vector<float> raw(kWidth);
  dequantize_row(DType::Q4_0, rotating.key_rows(), raw.data(), kWidth);
  hadamard_rows(raw.data(), 1, kWidth, 128);
  EXPECT_EQ(rotating.key_floats(0), raw);
  EXPECT_EQ(rotating.key_floats(0), stored(DType::Q4_0, key));
  std::vector<float> plain_round_trip = key;
  round_trip_to_cache_type(DType::Q4_0, 0, plain_round_trip.data(), 1, kWidth);
  EXPECT_EQ(plain.key_floats(0), plain_round_trip);
  EXPECT_NE(rotating.key_floats(0), plain.key_floats(0));
  std::vector<float> value_round_trip = value;
  round_trip_to_cache_type(DType::Q4_0, 64, value_round_trip.data(), 1, kWidth);
  EXPECT_EQ(rotating.value_floats(0), value_round_trip);
  std::vector<float> scratch;
  const float* as_f32 = rotating.values_as_f32(0, 1, scratch);
  EXPECT_EQ(std::vector<float>(as_f32, as_f32 + kWidth), value_round_trip);
}

TEST(KvCache, RefusesCacheTypesThatDoNotFitTheHead) {
  EXPECT_EQ(kv_cache_type_names(), "f32, f16, bf16, q8_0, q4_0");
  EXPECT_EQ(kv_cache_type_from_name("q8_0"), DType::Q8_0);
  const auto message_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of([] {
              kv_cache_type_from_name("q4_K");
            }).find("unknown KV cache type 'q4_K' (types: f32, f16, bf16, q8_0, q4_0)"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              KvCache(2, 1, 8, {DType::F16, DType::Q8_0});
            })
                .find("--cache-type-v: q8_0 stores blocks of 32 values, which do not divide this "
                      "model's head width of 8"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              KvCache(2, 1, 64, {DType::Q4_K, DType::F32});
            }).find("--cache-type-k: q4_K is not a KV cache type"),
            std::string::npos);
  const KvCache cache(2, 3, 64, {DType::Q8_0, DType::Q4_0});
  EXPECT_EQ(cache.type(), (KvCacheType{DType::Q8_0, DType::Q4_0}));
  EXPECT_EQ(cache.layer(1).heads[2].type(), cache.type());
}

}  // namespace
}  // namespace protokv
