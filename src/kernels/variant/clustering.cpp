// SPDX-License-Identifier: Apache-2.0
// The inner loops of ProtoKV's clustering for one instruction set (kernels/clustering.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/clustering.h"
#include "kernels/simd.h"
#include "kernels/variant.h"

namespace protokv::kernels {
#if defined(PROTOKV_HAVE_AVX512)
namespace {

// The sums of four 16-lane vectors, in lanes 0..3: one reduction tree for the four (the rows of
// the chunk pass are reduced four at a time, not one horizontal sum each).
inline __m128 reduce_four(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // Per 128-bit lane: [a0_0 + a0_2, a1_0 + a1_2, a0_1 + a0_3, a1_1 + a1_3], and alike for a2, a3.
  const __m512 u01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 u23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  // Per 128-bit lane: [a0, a1, a2, a3] summed over the lane's four floats.
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u01, u23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(u01, u23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Rows [t, t + 4) of the chunk [.., end), clamped: rows past the end repeat the last one (their
// results are not stored).
template <int d>
inline void four_rows(const float* keys, int64_t t, int64_t end, const float* (&row)[4]) {
  for (int r = 0; r < 4; ++r) row[r] = keys + std::min(t + r, end - 1) * d;
}

// Stores the first `live` lanes of x at out[0..live).
inline void store_live(float* out, __m128 x, int64_t live) {
  _mm_mask_storeu_ps(out, static_cast<__mmask8>(live >= 4 ? 0xF : (1u << live) - 1u), x);
}

// dot(row, vec) for rows [begin, end), four rows per reduction: out[t].
template <int d>
void dot_rows(const float* keys, int64_t begin, int64_t end, const float* vec, float* out) {
  constexpr int kVectors = d / 16;
  for (int64_t t = begin; t < end; t += 4) {
    const float* row[4];
    four_rows<d>(keys, t, end, row);
    __m512 acc[4][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    for (int v = 0; v < kVectors; ++v) {
      const __m512 x = _mm512_loadu_ps(vec + 16 * v);
      for (int r = 0; r < 4; ++r)
        acc[r][v & 1] = _mm512_fmadd_ps(_mm512_loadu_ps(row[r] + 16 * v), x, acc[r][v & 1]);
    }
    store_live(
        out + t,
        reduce_four(_mm512_add_ps(acc[0][0], acc[0][1]), _mm512_add_ps(acc[1][0], acc[1][1]),
                    _mm512_add_ps(acc[2][0], acc[2][1]), _mm512_add_ps(acc[3][0], acc[3][1])),
        end - t);
  }
}

}  // namespace
#endif

namespace {

// Dots of rows [begin, end) with one vector, into out[t]: four rows per reduction where the build
// has AVX-512 and head_dim is 64, 128 or 256.
void rows_dot_impl(const float* rows, int64_t begin, int64_t end, int d, const float* vec,
                   float* out) {
#if defined(PROTOKV_HAVE_AVX512)
  switch (d) {
    case 64:
      return dot_rows<64>(rows, begin, end, vec, out);
    case 128:
      return dot_rows<128>(rows, begin, end, vec, out);
    case 256:
      return dot_rows<256>(rows, begin, end, vec, out);
    default:
      break;
  }
#endif
  for (int64_t t = begin; t < end; ++t) out[t] = VariantOps::dot(rows + t * d, vec, d);
}

// A chunk's mean as the chunk pass computes it: sum times 1/count, one float multiply per channel.
void chunk_mean(const float* sum, int d, int64_t count, float* mean) {
  const float inv_count = 1.0f / static_cast<float>(count);
  for (int c = 0; c < d; ++c) mean[c] = sum[c] * inv_count;
}

// Eq. 10's ||sigma_m||: the norm of the chunk's per-channel population standard deviations,
// ||sigma||^2 = sum_c Var_c = E||k||^2 - ||mu||^2, from the squared key norms the pass computes
// anyway (no second sweep over the rows). Differences below float rounding of the two terms
// (1e-6 of E||k||^2) count as zero: a chunk of equal keys has sigma = 0.
float chunk_sigma_norm(double sum_sq, int64_t count, float mean_sq) {
  const double mean_key_sq = sum_sq / static_cast<double>(count);
  const double variance = mean_key_sq - static_cast<double>(mean_sq);
  return variance > 1e-6 * mean_key_sq ? static_cast<float>(std::sqrt(variance)) : 0.0f;
}

// assign=local's neighbour slots for chunk m once its mean mu_m is known (its own slot is written
// with the Eq. 10 cosine's dot): the dots of chunk m's rows with the means of the `reach` chunks
// before it, and of their rows with mu_m. The chunks after m fill m's later slots when they run.
// Each earlier mean is recomputed from its sum exactly as the pass computed it (sum times
// 1/count, one float multiply per channel), so the dots do not depend on how the chunks were cut
// into ranges. Rows of nearby chunks are still in cache.
// The `before_done` chunks right before m already have their "rows of m" dots (the AVX-512 kernel
// computes the previous chunk's together with the own dot, one read of each row).
void neighbour_dots(const float* keys, int64_t n, int d, int64_t k, int64_t m, const float* mu_m,
                    const float* chunk_sums, const LocalDots& local, int64_t before_done = 0) {
  thread_local std::vector<float> mean;
  mean.resize(static_cast<size_t>(d));
  const int64_t begin = chunk_begin(m, n, k), end = chunk_begin(m + 1, n, k);
  for (int64_t j = std::max<int64_t>(0, m - local.reach); j < m; ++j) {
    const int64_t j_begin = chunk_begin(j, n, k), j_end = chunk_begin(j + 1, n, k);
    const int64_t gap = m - j;
    if (gap > before_done) chunk_mean(chunk_sums + j * d, d, j_end - j_begin, mean.data());
    float* before = local.dots + (local.reach - gap) * n;  // rows of m, candidate j
    float* after = local.dots + (local.reach + gap) * n;   // rows of j, candidate m
    if (gap > before_done) rows_dot_impl(keys, begin, end, d, mean.data(), before);
    rows_dot_impl(keys, j_begin, j_end, d, mu_m, after);
  }
}

}  // namespace

#if defined(PROTOKV_HAVE_AVX512)
namespace {

// chunk_pass for head_dim = 16 * kVectors: the chunk's per-channel sums stay in registers over its
// rows (added in row order, as the plain loops do), and the norms and dots of four rows share one
// reduction tree. The norms, cosines and dots therefore equal the plain loops' up to float
// rounding (tested), and the chunk sums bit for bit.
template <int kVectors>
void chunk_pass_avx512(const float* keys, int64_t n, int64_t k, int64_t m_begin, int64_t m_end,
                       float* norms, float* chunk_sums, float* delta, const LocalDots& local) {
  constexpr int d = 16 * kVectors;
  using Ops = Avx512Ops;
  alignas(64) float mu[d], mu_previous[d];
  alignas(16) float squares[4];
  for (int64_t m = m_begin; m < m_end; ++m) {
    const int64_t begin = chunk_begin(m, n, k), end = chunk_begin(m + 1, n, k);
    __m512 sum[kVectors];
    for (auto& v : sum) v = _mm512_setzero_ps();
    double sum_sq = 0.0;  // sum of ||k_t||^2 over the chunk, in row order
    int64_t t = begin;
    for (; t + 4 <= end; t += 4) {  // four rows, one reduction tree
      const float* row = keys + t * d;
      __m512 acc[4][2];
      for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
      for (int r = 0; r < 4; ++r)
        for (int v = 0; v < kVectors; ++v) {
          const __m512 x = _mm512_loadu_ps(row + r * d + 16 * v);
          acc[r][v & 1] = _mm512_fmadd_ps(x, x, acc[r][v & 1]);
          sum[v] = _mm512_add_ps(sum[v], x);
        }
      const __m128 sq =
          reduce_four(_mm512_add_ps(acc[0][0], acc[0][1]), _mm512_add_ps(acc[1][0], acc[1][1]),
                      _mm512_add_ps(acc[2][0], acc[2][1]), _mm512_add_ps(acc[3][0], acc[3][1]));
      _mm_storeu_ps(norms + t, _mm_sqrt_ps(sq));
      _mm_store_ps(squares, sq);
      for (const float square : squares) sum_sq += square;
    }
    for (; t < end; ++t) {  // the last 1-3 rows
      const float* key = keys + t * d;
      const float sq = Ops::dot(key, key, d);
      norms[t] = std::sqrt(sq);
      sum_sq += sq;
      for (int v = 0; v < kVectors; ++v)
        sum[v] = _mm512_add_ps(sum[v], _mm512_loadu_ps(key + 16 * v));
    }
    float* out_sum = chunk_sums + m * d;
    for (int v = 0; v < kVectors; ++v) _mm512_storeu_ps(out_sum + 16 * v, sum[v]);
    if (delta == nullptr && local.dots == nullptr) continue;
    const __m512 inv = _mm512_set1_ps(1.0f / static_cast<float>(end - begin));
    for (int v = 0; v < kVectors; ++v) _mm512_store_ps(mu + 16 * v, _mm512_mul_ps(sum[v], inv));
    const float mean_sq = Ops::dot(mu, mu, d);
    const float mean_norm = std::sqrt(mean_sq);
    float* own =
        local.dots != nullptr ? local.dots + static_cast<int64_t>(local.reach) * n : nullptr;
    // assign=local: the previous chunk's mean, dotted with each row together with its own.
    const bool with_previous = own != nullptr && local.reach >= 1 && m >= 1;
    float* previous_slot = with_previous ? own - n : nullptr;
    if (with_previous)
      chunk_mean(chunk_sums + (m - 1) * d, d, begin - chunk_begin(m - 1, n, k), mu_previous);
    for (int64_t t = begin; t < end; t += 4) {
      const float* row[4];
      four_rows<d>(keys, t, end, row);
      const int64_t live = std::min<int64_t>(4, end - t);
      __m128 dot;
      if (with_previous) {
        __m512 own_acc[4], previous_acc[4];
        for (int r = 0; r < 4; ++r) own_acc[r] = previous_acc[r] = _mm512_setzero_ps();
        for (int v = 0; v < kVectors; ++v) {
          const __m512 x = _mm512_load_ps(mu + 16 * v);
          const __m512 y = _mm512_load_ps(mu_previous + 16 * v);
          for (int r = 0; r < 4; ++r) {
            const __m512 key = _mm512_loadu_ps(row[r] + 16 * v);
            own_acc[r] = _mm512_fmadd_ps(key, x, own_acc[r]);
            previous_acc[r] = _mm512_fmadd_ps(key, y, previous_acc[r]);
          }
        }
        dot = reduce_four(own_acc[0], own_acc[1], own_acc[2], own_acc[3]);
        store_live(previous_slot + t,
                   reduce_four(previous_acc[0], previous_acc[1], previous_acc[2], previous_acc[3]),
                   live);
      } else {
        __m512 own_acc[4][2];
        for (auto& a : own_acc) a[0] = a[1] = _mm512_setzero_ps();
        for (int v = 0; v < kVectors; ++v) {
          const __m512 x = _mm512_load_ps(mu + 16 * v);
          for (int r = 0; r < 4; ++r)
            own_acc[r][v & 1] =
                _mm512_fmadd_ps(_mm512_loadu_ps(row[r] + 16 * v), x, own_acc[r][v & 1]);
        }
        dot = reduce_four(_mm512_add_ps(own_acc[0][0], own_acc[0][1]),
                          _mm512_add_ps(own_acc[1][0], own_acc[1][1]),
                          _mm512_add_ps(own_acc[2][0], own_acc[2][1]),
                          _mm512_add_ps(own_acc[3][0], own_acc[3][1]));
      }
      if (own != nullptr) store_live(own + t, dot, live);
      if (delta == nullptr) continue;
      // 1 - cos(k_t, mu_m); a zero key or mean has cosine 0.
      alignas(16) float dots[4];
      _mm_store_ps(dots, dot);
      for (int64_t r = 0; r < live; ++r) {
        const float row_scale = norms[t + r] * mean_norm;
        delta[t + r] = 1.0f - (row_scale > 0.0f ? dots[r] / row_scale : 0.0f);
      }
    }
    if (own != nullptr)
      neighbour_dots(keys, n, d, k, m, mu, chunk_sums, local, with_previous ? 1 : 0);
    if (delta == nullptr) continue;
    const float sigma_norm = chunk_sigma_norm(sum_sq, end - begin, mean_sq);
    for (int64_t t = begin; t < end; ++t)  // Eq. 10; identical keys (sigma = 0): nothing deviates
      delta[t] = sigma_norm > 0.0f ? delta[t] / sigma_norm : 0.0f;
  }
}

}  // namespace
#endif

namespace {

// The chunk pass with plain loops, for any head_dim.
void chunk_pass_plain_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                            int64_t m_end, float* norms, float* chunk_sums, float* delta,
                            const LocalDots& local) {
  std::vector<float> mean(static_cast<size_t>(d));
  for (int64_t m = m_begin; m < m_end; ++m) {
    const int64_t begin = chunk_begin(m, n, k), end = chunk_begin(m + 1, n, k);
    float* __restrict sum = chunk_sums + m * d;
    std::fill(sum, sum + d, 0.0f);
    double sum_sq = 0.0;  // sum of ||k_t||^2 over the chunk
    for (int64_t t = begin; t < end; ++t) {
      const float* __restrict key = keys + t * d;
      const float sq = VariantOps::dot(key, key, d);
      norms[t] = std::sqrt(sq);
      sum_sq += sq;
      for (int c = 0; c < d; ++c) sum[c] += key[c];
    }
    if (delta == nullptr && local.dots == nullptr) continue;
    float* mu = mean.data();
    chunk_mean(sum, d, end - begin, mu);
    const float mean_sq = VariantOps::dot(mu, mu, d);
    const float mean_norm = std::sqrt(mean_sq);
    float* own =
        local.dots != nullptr ? local.dots + static_cast<int64_t>(local.reach) * n : nullptr;
    for (int64_t t = begin; t < end; ++t) {
      const float dot = VariantOps::dot(keys + t * d, mu, d);
      if (own != nullptr) own[t] = dot;
      if (delta == nullptr) continue;
      const float scale = norms[t] * mean_norm;
      delta[t] = 1.0f - (scale > 0.0f ? dot / scale : 0.0f);
    }
    if (own != nullptr) neighbour_dots(keys, n, d, k, m, mu, chunk_sums, local);
    if (delta == nullptr) continue;
    const float sigma_norm = chunk_sigma_norm(sum_sq, end - begin, mean_sq);
    for (int64_t t = begin; t < end; ++t)  // Eq. 10; identical keys (sigma = 0): nothing deviates
      delta[t] = sigma_norm > 0.0f ? delta[t] / sigma_norm : 0.0f;
  }
}

}  // namespace

namespace {

// Index of the first maximum of row[0, count). The maximum is found with independent lanes (a
// vectorisable loop), then its first position.
int first_argmax(const float* row, int count) {
  constexpr int kLanes = 16;
  float lanes[kLanes];
  for (float& lane : lanes) lane = row[0];
  int c = 0;
  for (; c + kLanes <= count; c += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] = lanes[j] < row[c + j] ? row[c + j] : lanes[j];
  float best = lanes[0];
  for (int j = 1; j < kLanes; ++j) best = best < lanes[j] ? lanes[j] : best;
  for (; c < count; ++c) best = best < row[c] ? row[c] : best;
  for (int i = 0; i < count; ++i)
    if (row[i] == best) return i;
  return 0;  // only when every value is NaN
}

}  // namespace

#if defined(PROTOKV_HAVE_AVX512)
namespace {

constexpr int kTileRows = 12;  // key rows per micro-tile: 12 x 2 accumulators of 16 lanes
constexpr int kTileCols = 32;  // prototypes per micro-tile

// Running first maximum of kTileRows keys over the prototypes, lane by lane: lane l of row r
// holds the largest dot seen so far among the prototypes j = l (mod kTileCols) and the first
// such j (strict > over ascending j, so a later equal value never replaces an earlier one).
struct TileArgmax {
  alignas(64) float value[kTileRows][kTileCols];
  alignas(64) int32_t index[kTileRows][kTileCols];
  bool first_is_nan[kTileRows];
};

// For kTileRows key rows, the first maximum of keys[r] . prototype j over the `count` prototypes,
// from the prototypes transposed to [d, padded] (padded a multiple of kTileCols, zero columns past
// the count). The 24 accumulators stay in registers over the whole head dimension; each step is
// two prototype loads and 24 FMAs with broadcast key entries. The dots of a 12 x 32 tile go
// straight into the running lane-wise maximum, never to memory: the argmax is fused into the GEMM.
void argmax_tile(const float* keys, int d, const float* transposed, int padded, int count,
                 TileArgmax& best) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  for (int r = 0; r < kTileRows; ++r) {
    _mm512_store_ps(best.value[r], minus_inf);
    _mm512_store_ps(best.value[r] + 16, minus_inf);
    _mm512_store_si512(best.index[r], _mm512_setzero_si512());
    _mm512_store_si512(best.index[r] + 16, _mm512_setzero_si512());
  }
  for (int j0 = 0; j0 < padded; j0 += kTileCols) {
    __m512 acc[kTileRows][2];
    for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
    const float* column = transposed + j0;
    for (int c = 0; c < d; ++c) {
      const __m512 lo = _mm512_loadu_ps(column + static_cast<int64_t>(c) * padded);
      const __m512 hi = _mm512_loadu_ps(column + static_cast<int64_t>(c) * padded + 16);
      for (int r = 0; r < kTileRows; ++r) {
        const __m512 key = _mm512_set1_ps(keys[static_cast<int64_t>(r) * d + c]);
        acc[r][0] = _mm512_fmadd_ps(key, lo, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(key, hi, acc[r][1]);
      }
    }
    // Zero-padded columns past the count are no candidates.
    const __mmask16 live_lo =
        count - j0 >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (count - j0)) - 1u);
    const __mmask16 live_hi = count - j0 >= 32 ? __mmask16(0xFFFF)
                              : count - j0 > 16
                                  ? static_cast<__mmask16>((1u << (count - j0 - 16)) - 1u)
                                  : __mmask16(0);
    const __m512i index_lo = _mm512_add_epi32(lane, _mm512_set1_epi32(j0));
    const __m512i index_hi = _mm512_add_epi32(index_lo, _mm512_set1_epi32(16));
    for (int r = 0; r < kTileRows; ++r) {
      if (j0 == 0) best.first_is_nan[r] = std::isnan(_mm512_cvtss_f32(acc[r][0]));
      const __m512 value_lo = _mm512_load_ps(best.value[r]);
      const __m512 value_hi = _mm512_load_ps(best.value[r] + 16);
      // Ordered comparison: a NaN dot never becomes the maximum.
      const __mmask16 up_lo = _mm512_mask_cmp_ps_mask(live_lo, acc[r][0], value_lo, _CMP_GT_OQ);
      const __mmask16 up_hi = _mm512_mask_cmp_ps_mask(live_hi, acc[r][1], value_hi, _CMP_GT_OQ);
      _mm512_mask_store_ps(best.value[r], up_lo, acc[r][0]);
      _mm512_mask_store_ps(best.value[r] + 16, up_hi, acc[r][1]);
      _mm512_mask_store_epi32(best.index[r], up_lo, index_lo);
      _mm512_mask_store_epi32(best.index[r] + 16, up_hi, index_hi);
    }
  }
}

// Row r's first maximum from the lane-wise maxima: the largest value, then the lowest index among
// the lanes that hold it. Returns -1 where first_argmax's special cases apply (no finite maximum,
// or a NaN first dot), for the caller to settle with first_argmax itself.
int32_t reduce_tile_argmax(const TileArgmax& best, int r) {
  if (best.first_is_nan[r]) return -1;
  const __m512 value_lo = _mm512_load_ps(best.value[r]);
  const __m512 value_hi = _mm512_load_ps(best.value[r] + 16);
  const float top = _mm512_reduce_max_ps(_mm512_max_ps(value_lo, value_hi));
  if (top == -INFINITY) return -1;
  const __m512 top_v = _mm512_set1_ps(top);
  const __mmask16 at_lo = _mm512_cmp_ps_mask(value_lo, top_v, _CMP_EQ_OQ);
  const __mmask16 at_hi = _mm512_cmp_ps_mask(value_hi, top_v, _CMP_EQ_OQ);
  const __m512i none = _mm512_set1_epi32(INT32_MAX);
  const __m512i index =
      _mm512_min_epi32(_mm512_mask_mov_epi32(none, at_lo, _mm512_load_si512(best.index[r])),
                       _mm512_mask_mov_epi32(none, at_hi, _mm512_load_si512(best.index[r] + 16)));
  return _mm512_reduce_min_epi32(index);
}

}  // namespace
#endif

namespace PROTOKV_KERNEL_VARIANT {

void assign_to_prototypes(const float* keys, int64_t n, int d, const float* prototypes, int count,
                          int32_t* out) {
  if (count <= 0) {
    std::fill(out, out + n, 0);
    return;
  }
#if defined(PROTOKV_HAVE_AVX512)
  // A register-blocked GEMM fused with the argmax (argmax_tile): no dot ever goes to memory.
  // Workspaces are reused across calls (one set per thread), so no call pays for fresh zeroed
  // pages.
  const int padded = (count + kTileCols - 1) / kTileCols * kTileCols;
  thread_local std::vector<float> transposed, dots, tail;
  transposed.assign(static_cast<size_t>(d) * static_cast<size_t>(padded), 0.0f);
  for (int j = 0; j < count; ++j)
    for (int c = 0; c < d; ++c)
      transposed[static_cast<size_t>(c) * static_cast<size_t>(padded) + static_cast<size_t>(j)] =
          prototypes[static_cast<int64_t>(j) * d + c];
  TileArgmax best;
  for (int64_t t0 = 0; t0 < n; t0 += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, n - t0);
    const float* tile = keys + t0 * d;
    if (rows < kTileRows) {  // last partial tile: zero rows, their results unused
      tail.assign(static_cast<size_t>(kTileRows) * static_cast<size_t>(d), 0.0f);
      std::copy(tile, tile + rows * d, tail.begin());
      tile = tail.data();
    }
    argmax_tile(tile, d, transposed.data(), padded, count, best);
    for (int64_t r = 0; r < rows; ++r) {
      int32_t index = reduce_tile_argmax(best, static_cast<int>(r));
      if (index < 0) {  // NaN or -inf dots (non-finite keys): the plain first maximum
        dots.resize(static_cast<size_t>(count));
        for (int j = 0; j < count; ++j) {
          float dot = 0.0f;  // the FMA chain of argmax_tile, lane by lane
          for (int c = 0; c < d; ++c)
            dot = std::fma(tile[r * d + c], prototypes[static_cast<int64_t>(j) * d + c], dot);
          dots[static_cast<size_t>(j)] = dot;
        }
        index = first_argmax(dots.data(), count);
      }
      out[t0 + r] = index;
    }
  }
#else
  // k . c for unit prototypes c: cos(k, c) times ||k||, the same argmax over c (so the keys need
  // no normalised copy). Every dot is one FMA chain over the head dimension, as argmax_tile
  // computes it, vectorised across prototypes (transposed to [d, count]): equal prototypes give
  // equal dots, so ties resolve to the first maximum on every instruction set. (A BLAS GEMM does
  // not guarantee that: OpenBLAS's Haswell/Zen kernels round a column tail differently.)
  thread_local std::vector<float> transposed, dots;
  transposed.resize(static_cast<size_t>(d) * static_cast<size_t>(count));
  for (int j = 0; j < count; ++j)
    for (int c = 0; c < d; ++c)
      transposed[static_cast<size_t>(c) * static_cast<size_t>(count) + static_cast<size_t>(j)] =
          prototypes[static_cast<int64_t>(j) * d + c];
  dots.resize(static_cast<size_t>(count));
  for (int64_t t = 0; t < n; ++t) {
    float* dot = dots.data();
    std::fill(dot, dot + count, 0.0f);
    for (int c = 0; c < d; ++c) {
      const float key = keys[t * d + c];
      const float* column = transposed.data() + static_cast<size_t>(c) * static_cast<size_t>(count);
      for (int j = 0; j < count; ++j) dot[j] = std::fma(key, column[j], dot[j]);
    }
    out[t] = first_argmax(dot, count);
  }
#endif
}

void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local) {
#if defined(PROTOKV_HAVE_AVX512)
  switch (d) {
    case 64:
      return chunk_pass_avx512<4>(keys, n, k, m_begin, m_end, norms, chunk_sums, delta, local);
    case 128:
      return chunk_pass_avx512<8>(keys, n, k, m_begin, m_end, norms, chunk_sums, delta, local);
    case 256:
      return chunk_pass_avx512<16>(keys, n, k, m_begin, m_end, norms, chunk_sums, delta, local);
    default:
      break;
  }
#endif
  chunk_pass_plain_range(keys, n, d, k, m_begin, m_end, norms, chunk_sums, delta, local);
}

void rows_dot(const float* rows, int64_t begin, int64_t end, int d, const float* vec, float* out) {
  rows_dot_impl(rows, begin, end, d, vec, out);
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
