// Decode attention: one new query per head over that head's cached entries.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "protokv/error.h"

namespace protokv::kernels {
namespace {

// Keys come as consecutive segments (one for a dense head; PoD's shared keys give three):
// entry j of segment s is entry (entries of the segments before s) + j. values [n, d].
template <class Ops>
void decode_group_impl(const float* q, int group, std::span<const KeySegment> segments,
                       const float* values, const float* log_weights, int64_t n, int d, float* out,
                       float* probs) {
  std::fill(out, out + static_cast<int64_t>(group) * d, 0.0f);
  if (n <= 0) return;
  // Reused across calls (decode runs this per head, layer and token).
  thread_local std::vector<float> scratch;
  const size_t score_floats = probs ? 0 : static_cast<size_t>(group) * n;
  scratch.resize(static_cast<size_t>(group) * d + score_floats);
  float* scaled_q = scratch.data();                                            // [group, d]
  float* scores = probs ? probs : scaled_q + static_cast<int64_t>(group) * d;  // [group, n]

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t i = 0; i < static_cast<int64_t>(group) * d; ++i) scaled_q[i] = q[i] * scale;

  // Keys and values are walked in blocks of ~32 KB that stay in L1 while every head of the
  // group uses them: each is read from memory once per group.
  const int64_t block = std::max<int64_t>(8, (int64_t{32} << 10) / (4 * std::max(d, 1)));
  int64_t segment_first = 0;  // entry index of the segment's first key
  for (const KeySegment& segment : segments) {
    for (int64_t s0 = 0; s0 < segment.count; s0 += block) {
      const int64_t count = std::min(block, segment.count - s0);
      const int64_t j0 = segment_first + s0;
      const float* key_block = segment.keys + s0 * d;
      for (int h = 0; h < group; ++h) {
        float* s = scores + h * n + j0;
        int64_t j = 0;
        for (; j + 4 <= count; j += 4) Ops::dot4(scaled_q + h * d, key_block + j * d, d, d, s + j);
        for (; j < count; ++j) s[j] = Ops::dot(scaled_q + h * d, key_block + j * d, d);
        if (log_weights)  // Chelsea Eq. 2
          for (j = 0; j < count; ++j) s[j] += log_weights[j0 + j];
      }
    }
    segment_first += segment.count;
  }
  for (int h = 0; h < group; ++h) softmax_with<Ops>(scores + h * n, n);
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t count = std::min(block, n - j0);
    for (int h = 0; h < group; ++h)
      Ops::weighted_row_sum(scores + h * n + j0, values + j0 * d, count, d, out + h * d, d);
  }
}

// One query over the cached entries `indices` (cache rows, any order, repeats allowed): the dense
// kernel's arithmetic on the gathered subset. Scores use the same SIMD dot and softmax; values are
// accumulated row by row with the SIMD axpy (the rows are not contiguous).
// `key_of(row)` gives the key of cache row `row` (contiguous keys, or PoD's key segments).
template <class Ops, class KeyOf>
void decode_gathered_impl(const float* q, const KeyOf& key_of, const float* values,
                          const float* log_weights, std::span<const int32_t> indices, int d,
                          float* out, float* probs) {
  std::fill(out, out + d, 0.0f);
  const auto n = static_cast<int64_t>(indices.size());
  if (n <= 0) return;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(d) + (probs ? 0 : static_cast<size_t>(n)));
  float* scaled_q = scratch.data();
  float* scores = probs ? probs : scaled_q + d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int i = 0; i < d; ++i) scaled_q[i] = q[i] * scale;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = indices[static_cast<size_t>(j)];
    scores[j] = Ops::dot(scaled_q, key_of(row), d);
    if (log_weights) scores[j] += log_weights[row];  // Chelsea Eq. 2
  }
  softmax_with<Ops>(scores, n);
  for (int64_t j = 0; j < n; ++j)
    Ops::axpy(scores[j], values + static_cast<int64_t>(indices[static_cast<size_t>(j)]) * d, out,
              d);
}

}  // namespace

void attention_decode_group(Isa isa, const float* q, int group, const float* keys,
                            const float* values, const float* log_weights, int64_t n, int d,
                            float* out, float* probs) {
  const KeySegment all{keys, n};
  with_isa(isa, [&](auto ops) {
    decode_group_impl<decltype(ops)>(q, group, {&all, 1}, values, log_weights, n, d, out, probs);
  });
}

void attention_decode_group(const float* q, int group, const float* keys, const float* values,
                            const float* log_weights, int64_t n, int d, float* out, float* probs) {
  const KeySegment all{keys, n};
  decode_group_impl<BestOps>(q, group, {&all, 1}, values, log_weights, n, d, out, probs);
}

void attention_decode(const float* q, const float* keys, const float* values,
                      const float* log_weights, int64_t n, int d, float* out, float* probs) {
  const KeySegment all{keys, n};
  decode_group_impl<BestOps>(q, 1, {&all, 1}, values, log_weights, n, d, out, probs);
}

namespace {
int64_t segment_entries(std::span<const KeySegment> segments) {
  int64_t n = 0;
  for (const KeySegment& segment : segments) n += segment.count;
  return n;
}
}  // namespace

void attention_decode_group_segments(Isa isa, const float* q, int group,
                                     std::span<const KeySegment> keys, const float* values,
                                     const float* log_weights, int d, float* out, float* probs) {
  const int64_t n = segment_entries(keys);
  with_isa(isa, [&](auto ops) {
    decode_group_impl<decltype(ops)>(q, group, keys, values, log_weights, n, d, out, probs);
  });
}

void attention_decode_group_segments(const float* q, int group, std::span<const KeySegment> keys,
                                     const float* values, const float* log_weights, int d,
                                     float* out, float* probs) {
  decode_group_impl<BestOps>(q, group, keys, values, log_weights, segment_entries(keys), d, out,
                             probs);
}

namespace {
// Key rows of a contiguous [n, d] block.
struct ContiguousKeys {
  const float* keys;
  int d;
  const float* operator()(int64_t row) const { return keys + row * d; }
};
// Key rows spread over consecutive segments (at most a few: PoD has three).
struct SegmentedKeys {
  std::span<const KeySegment> segments;
  int d;
  const float* operator()(int64_t row) const {
    for (const KeySegment& segment : segments) {
      if (row < segment.count) return segment.keys + row * d;
      row -= segment.count;
    }
    fail("gathered decode attention: entry beyond the key segments");
  }
};
}  // namespace

void attention_decode_gathered(Isa isa, const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs) {
  with_isa(isa, [&](auto ops) {
    decode_gathered_impl<decltype(ops)>(q, ContiguousKeys{keys, d}, values, log_weights, indices, d,
                                        out, probs);
  });
}

void attention_decode_gathered(const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs) {
  decode_gathered_impl<BestOps>(q, ContiguousKeys{keys, d}, values, log_weights, indices, d, out,
                                probs);
}

void attention_decode_gathered_segments(Isa isa, const float* q, std::span<const KeySegment> keys,
                                        const float* values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs) {
  with_isa(isa, [&](auto ops) {
    decode_gathered_impl<decltype(ops)>(q, SegmentedKeys{keys, d}, values, log_weights, indices, d,
                                        out, probs);
  });
}

void attention_decode_gathered_segments(const float* q, std::span<const KeySegment> keys,
                                        const float* values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs) {
  decode_gathered_impl<BestOps>(q, SegmentedKeys{keys, d}, values, log_weights, indices, d, out,
                                probs);
}

}  // namespace protokv::kernels
