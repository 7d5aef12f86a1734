// SPDX-License-Identifier: Apache-2.0
// Decode attention: one new query per head over that head's cached entries.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/simd.h"
#include "kernels/variant.h"
#include "protokv/error.h"

namespace protokv::kernels {
namespace {

// F32 rows [count, d] of typed cache rows starting at row `first`: the rows themselves for F32,
// else dequantised into `tile` (an L1-sized block: the kernels walk the cache in such blocks, so a
// quantised cache is read from memory once, in its own size, and expanded in cache).
template <class Ops>
const float* rows_f32(const void* rows, DType type, int64_t first, int64_t count, int d,
                      std::vector<float>& tile) {
  if (type == DType::F32) return static_cast<const float*>(rows) + first * d;
  const size_t row_bytes = dtype_row_bytes(type, d);
  const size_t need = static_cast<size_t>(count) * static_cast<size_t>(d);
  if (tile.size() < need) tile.resize(need);
  Ops::to_f32(type, static_cast<const uint8_t*>(rows) + static_cast<size_t>(first) * row_bytes,
              tile.data(), count * d);
  return tile.data();
}

// Keys come as consecutive segments (one for a dense head; PoD's shared keys give three):
// entry j of segment s is entry (entries of the segments before s) + j. values [n, d]. A
// segment with its own query ([group, d]) uses it instead of q for its logits.
template <class Ops>
void decode_group_impl(const float* q, int group, std::span<const KeySegment> segments,
                       ValueRows values, const float* log_weights, int64_t n, int d, float* out,
                       float* probs) {
  std::fill(out, out + static_cast<int64_t>(group) * d, 0.0f);
  if (n <= 0) return;
  // Reused across calls (decode runs this per head, layer and token).
  thread_local std::vector<float> scratch, tile;
  const size_t score_floats = probs ? 0 : static_cast<size_t>(group) * n;
  const int64_t q_floats = static_cast<int64_t>(group) * d;
  scratch.resize(static_cast<size_t>(2 * q_floats) + score_floats);
  float* scaled_q = scratch.data();                      // [group, d]
  float* segment_q = scaled_q + q_floats;                // [group, d]: a segment's own query
  float* scores = probs ? probs : segment_q + q_floats;  // [group, n]

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t i = 0; i < q_floats; ++i) scaled_q[i] = q[i] * scale;

  // Keys and values are walked in blocks of ~32 KB that stay in L1 while every head of the
  // group uses them: each is read from memory once per group.
  const int64_t block = std::max<int64_t>(8, (int64_t{32} << 10) / (4 * std::max(d, 1)));
  int64_t segment_first = 0;  // entry index of the segment's first key
  for (const KeySegment& segment : segments) {
    const float* query = scaled_q;
    if (segment.query != nullptr) {
      for (int64_t i = 0; i < q_floats; ++i) segment_q[i] = segment.query[i] * scale;
      query = segment_q;
    }
    for (int64_t s0 = 0; s0 < segment.count; s0 += block) {
      const int64_t count = std::min(block, segment.count - s0);
      const int64_t j0 = segment_first + s0;
      const float* key_block = rows_f32<Ops>(segment.keys, segment.type, s0, count, d, tile);
      for (int h = 0; h < group; ++h) {
        float* s = scores + h * n + j0;
        int64_t j = 0;
        for (; j + 4 <= count; j += 4) Ops::dot4(query + h * d, key_block + j * d, d, d, s + j);
        for (; j < count; ++j) s[j] = Ops::dot(query + h * d, key_block + j * d, d);
        if (log_weights)  // Chelsea Eq. 2
          for (j = 0; j < count; ++j) s[j] += log_weights[j0 + j];
      }
    }
    segment_first += segment.count;
  }
  for (int h = 0; h < group; ++h) softmax_with<Ops>(scores + h * n, n);
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t count = std::min(block, n - j0);
    const float* value_block = rows_f32<Ops>(values.data, values.type, j0, count, d, tile);
    for (int h = 0; h < group; ++h)
      Ops::weighted_row_sum(scores + h * n + j0, value_block, count, d, out + h * d, d);
  }
}

// One query over the cached entries `indices` (cache rows, any order, repeats allowed): the dense
// kernel's arithmetic on the gathered subset. Row r's key is row r of the concatenated key
// segments (one for a contiguous cache, PoD's shared keys give three), dotted with the segment's
// own query when it has one ([d] here). Runs of consecutive indices (a recalled cluster stored
// contiguously, ClusterKV) are read as spans with the dense kernel's 4-row dot and weighted row
// sum, which the hardware prefetcher can stream; isolated rows use the SIMD dot and axpy.
template <class Ops>
void decode_gathered_impl(const float* q, std::span<const KeySegment> segments, ValueRows values,
                          const float* log_weights, std::span<const int32_t> indices, int d,
                          float* out, float* probs) {
  std::fill(out, out + d, 0.0f);
  const auto n = static_cast<int64_t>(indices.size());
  if (n <= 0) return;
  thread_local std::vector<float> scratch, tile;
  // Runs of typed rows are expanded at most this many at a time (as the dense kernel's blocks).
  const int64_t block = std::max<int64_t>(8, (int64_t{32} << 10) / (4 * std::max(d, 1)));
  const auto n_segments = static_cast<int64_t>(segments.size());
  scratch.resize(static_cast<size_t>((n_segments + 1) * d) + (probs ? 0 : static_cast<size_t>(n)));
  float* scaled_q = scratch.data();  // [n_segments + 1, d]: q, then each segment's own
  float* scores = probs ? probs : scaled_q + (n_segments + 1) * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int i = 0; i < d; ++i) scaled_q[i] = q[i] * scale;
  for (int64_t s = 0; s < n_segments; ++s)
    if (segments[static_cast<size_t>(s)].query != nullptr)
      for (int i = 0; i < d; ++i)
        scaled_q[(s + 1) * d + i] = segments[static_cast<size_t>(s)].query[i] * scale;
  // Length of the run of consecutive entries starting at indices[j], capped at `limit` entries.
  const auto run_length = [&](int64_t j, int64_t limit) {
    const int64_t first = indices[static_cast<size_t>(j)];
    int64_t length = 1;
    while (length < limit && j + length < n &&
           indices[static_cast<size_t>(j + length)] == first + length)
      ++length;
    return length;
  };
  for (int64_t j = 0; j < n;) {
    const int64_t row = indices[static_cast<size_t>(j)];
    int64_t local = row, s = 0;
    while (s < n_segments && local >= segments[static_cast<size_t>(s)].count)
      local -= segments[static_cast<size_t>(s++)].count;
    if (s == n_segments) fail("gathered decode attention: entry {} beyond the keys", row);
    const KeySegment& segment = segments[static_cast<size_t>(s)];
    const float* query = segment.query != nullptr ? scaled_q + (s + 1) * d : scaled_q;
    // A run never crosses into the next segment (its keys live elsewhere).
    const int64_t length =
        run_length(j, segment.type == DType::F32 ? segment.count - local
                                                 : std::min(block, segment.count - local));
    const float* keys = rows_f32<Ops>(segment.keys, segment.type, local, length, d, tile);
    float* run_scores = scores + j;
    int64_t i = 0;
    for (; i + 4 <= length; i += 4) Ops::dot4(query, keys + i * d, d, d, run_scores + i);
    for (; i < length; ++i) run_scores[i] = Ops::dot(query, keys + i * d, d);
    if (log_weights)  // Chelsea Eq. 2
      for (i = 0; i < length; ++i) run_scores[i] += log_weights[row + i];
    j += length;
  }
  softmax_with<Ops>(scores, n);
  for (int64_t j = 0; j < n;) {
    const int64_t row = indices[static_cast<size_t>(j)];
    const int64_t length = run_length(j, values.type == DType::F32 ? n : block);
    const float* rows = rows_f32<Ops>(values.data, values.type, row, length, d, tile);
    if (length == 1)
      Ops::axpy(scores[j], rows, out, d);
    else
      Ops::weighted_row_sum(scores + j, rows, length, d, out, d);
    j += length;
  }
}

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void attention_decode_group_segments(const float* q, int group, std::span<const KeySegment> keys,
                                     ValueRows values, const float* log_weights, int64_t n, int d,
                                     float* out, float* probs) {
  decode_group_impl<VariantOps>(q, group, keys, values, log_weights, n, d, out, probs);
}

void attention_decode_gathered_segments(const float* q, std::span<const KeySegment> keys,
                                        ValueRows values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs) {
  decode_gathered_impl<VariantOps>(q, keys, values, log_weights, indices, d, out, probs);
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
