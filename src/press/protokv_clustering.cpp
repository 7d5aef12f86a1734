#include "press/protokv_clustering.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "core/rng.h"
#include "kernels/kernels.h"
#include "kernels/simd.h"
#include "protokv/error.h"

namespace protokv::press {
namespace {

// kernels::dot inlined where the build has AVX-512 (the same function kernels::dot dispatches to).
inline float fast_dot(const float* a, const float* b, int d) {
#if defined(PROTOKV_HAVE_AVX512)
  return kernels::Avx512Ops::dot(a, b, d);
#else
  return kernels::dot(a, b, d);
#endif
}

// Appends normalise(sum) to the prototypes unless the sum is zero.
void add_prototype(const float* sum, int d, int32_t origin, Clustering& out) {
  const double norm = std::sqrt(static_cast<double>(fast_dot(sum, sum, d)));
  if (!(norm > 0.0)) return;
  const auto inv = static_cast<float>(1.0 / norm);
  const size_t at = out.prototypes.size();
  out.prototypes.resize(at + static_cast<size_t>(d));
  float* prototype = out.prototypes.data() + at;
  for (int c = 0; c < d; ++c) prototype[c] = sum[c] * inv;
  out.origin.push_back(origin);
}

// Regular prototypes (ProtoKV Eq. 11): normalised sum of each chunk's keys outside O, from the
// chunk sums of chunk_pass minus the irregular keys (subtracted in place); chunks left empty are
// dropped.
void add_chunk_prototypes(const float* keys, int64_t n, int d, int64_t k, float* sums,
                          const std::vector<int32_t>& irregular, Clustering& out) {
  thread_local std::vector<int64_t> remaining;
  remaining.resize(static_cast<size_t>(k));
  for (int64_t m = 0; m < k; ++m)
    remaining[static_cast<size_t>(m)] = chunk_begin(m + 1, n, k) - chunk_begin(m, n, k);
  for (const int32_t t : irregular) {
    const int64_t m = chunk_of(t, n, k);
    float* sum = sums + m * d;
    const float* key = keys + static_cast<int64_t>(t) * d;
    for (int c = 0; c < d; ++c) sum[c] -= key[c];
    --remaining[static_cast<size_t>(m)];
  }
  for (int64_t m = 0; m < k; ++m)
    if (remaining[static_cast<size_t>(m)] > 0)
      add_prototype(sums + m * d, d, static_cast<int32_t>(m), out);
}

// Irregular prototypes (ProtoKV Eq. 15): tokens `rows` hashed into 2^bits buckets, each bucket's
// normalised key sum; empty buckets are dropped.
// make_lsh_projection's result for these arguments, drawn once per thread: a press draws the
// same projection for a (layer, head) at every prefill.
const LshProjection& cached_lsh_projection(int bits, int d, double gamma, uint64_t seed) {
  struct Entry {
    int bits, d;
    double gamma;
    uint64_t seed;
    LshProjection lsh;
  };
  constexpr size_t kCapacity = 1024;
  thread_local std::vector<Entry> cache;
  thread_local size_t next_slot = 0;
  for (const Entry& e : cache)
    if (e.bits == bits && e.d == d && e.gamma == gamma && e.seed == seed) return e.lsh;
  Entry entry{bits, d, gamma, seed, make_lsh_projection(bits, d, gamma, seed)};
  if (cache.size() < kCapacity) {
    cache.push_back(std::move(entry));
    return cache.back().lsh;
  }
  cache[next_slot] = std::move(entry);  // full: replace the oldest
  const size_t at = next_slot;
  next_slot = (next_slot + 1) % kCapacity;
  return cache[at].lsh;
}

void add_bucket_prototypes(const float* keys, const float* norms, const std::vector<int32_t>& rows,
                           int d, int bits, double gamma, uint64_t seed, Clustering& out) {
  const LshProjection& lsh = cached_lsh_projection(bits, d, gamma, seed);
  const int buckets = 1 << bits;
  std::vector<float> sums(static_cast<size_t>(buckets) * static_cast<size_t>(d),
                          0.0f);  // [buckets, d]
  std::vector<int64_t> counts(static_cast<size_t>(buckets), 0);
  std::vector<float> unit(static_cast<size_t>(d));
  for (const int32_t t : rows) {
    const float* key = keys + static_cast<int64_t>(t) * d;
    const float norm = norms[t];
    const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
    for (int c = 0; c < d; ++c) unit[static_cast<size_t>(c)] = key[c] * inv;  // hash the direction
    const int32_t b = lsh_bucket(lsh, unit.data());
    float* sum = sums.data() + static_cast<int64_t>(b) * d;
    for (int c = 0; c < d; ++c) sum[c] += key[c];
    ++counts[static_cast<size_t>(b)];
  }
  for (int b = 0; b < buckets; ++b)
    if (counts[static_cast<size_t>(b)] > 0)
      add_prototype(sums.data() + static_cast<int64_t>(b) * d, d, b, out);
}

}  // namespace

int64_t chunk_begin(int64_t m, int64_t n, int64_t k) {
  return m * n / k;
}

int64_t chunk_of(int64_t t, int64_t n, int64_t k) {
  int64_t m = (t * k) / n;  // never above the true chunk; step up at most once or twice
  while (m + 1 < k && chunk_begin(m + 1, n, k) <= t) ++m;
  while (m > 0 && chunk_begin(m, n, k) > t) --m;
  return m;
}

void normalise_rows(const float* in, int64_t n, int d, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* row = in + t * d;
    const float norm = std::sqrt(kernels::dot(row, row, d));
    const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
    for (int c = 0; c < d; ++c) out[t * d + c] = row[c] * inv;
  }
}

void key_norms(const float* keys, int64_t n, int d, float* norms) {
  for (int64_t t = 0; t < n; ++t) norms[t] = std::sqrt(kernels::dot(keys + t * d, keys + t * d, d));
}

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
void rows_dot(const float* rows, int64_t begin, int64_t end, int d, const float* vec, float* out) {
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
  for (int64_t t = begin; t < end; ++t) out[t] = fast_dot(rows + t * d, vec, d);
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
    if (gap > before_done) rows_dot(keys, begin, end, d, mean.data(), before);
    rows_dot(keys, j_begin, j_end, d, mu_m, after);
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
  using Ops = kernels::Avx512Ops;
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

void chunk_pass(const float* keys, int64_t n, int d, int64_t k, float* norms, float* chunk_sums,
                float* delta, const LocalDots& local) {
  chunk_pass_range(keys, n, d, k, 0, k, norms, chunk_sums, delta, local);
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
  chunk_pass_generic_range(keys, n, d, k, m_begin, m_end, norms, chunk_sums, delta, local);
}

void chunk_pass_generic(const float* keys, int64_t n, int d, int64_t k, float* norms,
                        float* chunk_sums, float* delta, const LocalDots& local) {
  chunk_pass_generic_range(keys, n, d, k, 0, k, norms, chunk_sums, delta, local);
}

void chunk_pass_generic_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
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
      const float sq = kernels::dot(key, key, d);
      norms[t] = std::sqrt(sq);
      sum_sq += sq;
      for (int c = 0; c < d; ++c) sum[c] += key[c];
    }
    if (delta == nullptr && local.dots == nullptr) continue;
    float* mu = mean.data();
    chunk_mean(sum, d, end - begin, mu);
    const float mean_sq = kernels::dot(mu, mu, d);
    const float mean_norm = std::sqrt(mean_sq);
    float* own =
        local.dots != nullptr ? local.dots + static_cast<int64_t>(local.reach) * n : nullptr;
    for (int64_t t = begin; t < end; ++t) {
      const float dot = kernels::dot(keys + t * d, mu, d);
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

void chunk_deviation(const float* keys, int64_t n, int d, int64_t k, float* delta) {
  std::vector<float> norms(static_cast<size_t>(n)), sums(static_cast<size_t>(k * d));
  chunk_pass(keys, n, d, k, norms.data(), sums.data(), delta);
}

void neighbourhood_outlier_degree(const float* keys, const float* norms, int64_t n, int d,
                                  int kappa, float* theta) {
  std::vector<double> similarity(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t j = std::max<int64_t>(0, i - kappa); j <= std::min<int64_t>(n - 1, i + kappa);
         ++j) {
      if (j == i) continue;
      const float scale = norms[i] * norms[j];
      sum += scale > 0.0f ? kernels::dot(keys + i * d, keys + j * d, d) / scale : 0.0f;
      ++count;
    }
    similarity[static_cast<size_t>(i)] = count > 0 ? sum / static_cast<double>(count) : 1.0;
  }
  double mean = 0.0;
  for (double s : similarity) mean += s;
  mean /= static_cast<double>(n);
  double var = 0.0;
  for (double s : similarity) var += (s - mean) * (s - mean);
  const double std_dev = std::sqrt(var / static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i)
    theta[i] = std_dev > 0.0
                   ? static_cast<float>(-(similarity[static_cast<size_t>(i)] - mean) / std_dev)
                   : 0.0f;
}

std::vector<int32_t> top_indices(const float* values, int64_t n, int64_t p) {
  p = std::clamp<int64_t>(p, 0, n);
  if (p == 0) return {};
  auto before = [&](int32_t a, int32_t b) {
    const float va = std::isnan(values[a]) ? -INFINITY : values[a];
    const float vb = std::isnan(values[b]) ? -INFINITY : values[b];
    return va != vb ? va > vb : a < b;
  };
  if (p <= 64 && p < n) {
    // A few out of many (the irregular set): one pass keeping the p best so far in order. The
    // order (value, then index) is total, so this is the same set as nth_element gives.
    std::vector<int32_t> best;
    best.reserve(static_cast<size_t>(p) + 1);
    float worst = -INFINITY;  // values[best.back()] once p are held
    constexpr int64_t kBlock = 16;
    const auto consider = [&](int64_t t) {
      const auto i = static_cast<int32_t>(t);
      if (static_cast<int64_t>(best.size()) == p && (values[t] < worst || !before(i, best.back())))
        return;
      best.insert(std::upper_bound(best.begin(), best.end(), i, before), i);
      if (static_cast<int64_t>(best.size()) > p) best.pop_back();
      if (static_cast<int64_t>(best.size()) == p) worst = values[best.back()];
    };
    int64_t t = 0;
    for (; t < n && static_cast<int64_t>(best.size()) < p; ++t) consider(t);
    for (; t + kBlock <= n; t += kBlock) {
      // Most blocks hold nothing above the p-th value so far: one vectorised maximum each (a NaN
      // in the block makes the comparison false, so the block is checked value by value).
      float block_max = values[t];
      for (int64_t j = 1; j < kBlock; ++j) block_max = std::max(block_max, values[t + j]);
      if (block_max < worst) continue;
      for (int64_t j = 0; j < kBlock; ++j) consider(t + j);
    }
    for (; t < n; ++t) consider(t);
    std::sort(best.begin(), best.end());
    return best;
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (p < n) std::nth_element(order.begin(), order.begin() + p, order.end(), before);
  order.resize(static_cast<size_t>(p));
  std::sort(order.begin(), order.end());
  return order;
}

LshProjection make_lsh_projection(int bits, int head_dim, double gamma, uint64_t seed) {
  LshProjection lsh;
  lsh.bits = bits;
  lsh.head_dim = head_dim;
  SplitMix64 rng(seed);
  lsh.w.resize(static_cast<size_t>(bits) * static_cast<size_t>(head_dim));
  for (float& x : lsh.w) x = static_cast<float>(gamma * rng.normal());  // W ~ N(0, gamma^2 I)
  lsh.phase.resize(static_cast<size_t>(bits));
  for (float& x : lsh.phase) x = static_cast<float>(2.0 * std::numbers::pi * rng.uniform());
  return lsh;
}

int32_t lsh_bucket(const LshProjection& lsh, const float* unit_key) {
  int32_t code = 0;
  for (int i = 0; i < lsh.bits; ++i) {
    const float projection = kernels::dot(lsh.w.data() + static_cast<int64_t>(i) * lsh.head_dim,
                                          unit_key, lsh.head_dim) +
                             lsh.phase[static_cast<size_t>(i)];
    // Eq. 12-13: sqrt(2/r) > 0, so phi > 0 exactly when cos(.) > 0. Eq. 14: first bit most
    // significant; with u = 2^r the "mod u" keeps every code.
    const int bit = std::cos(projection) > 0.0f ? 1 : 0;
    code = (code << 1) | bit;
  }
  return code;
}

uint64_t lsh_seed_for(uint64_t seed, int layer, int kv_head) {
  SplitMix64 mix(seed ^ (static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 32 |
                         static_cast<uint32_t>(kv_head)));
  mix.next();
  return mix.next();
}

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

namespace {

// The cosine of a token with the bucket prototypes may exceed its own chunk's only if
// angle(c_m, b) <= 2 angle(k, c_m) (triangle inequality on angles: angle(k, b) >=
// angle(c_m, b) - angle(k, c_m)), i.e. cos(c_m, b) >= 2 cos^2(k, c_m) - 1 for cos(k, c_m) >= 0.
// The margin keeps float rounding of the cosines on the safe side.
constexpr float kBucketPruneMargin = 1e-3f;

}  // namespace

int64_t assign_locally(const float* keys, int64_t n, int d, const float* norms,
                       const float* chunk_sums, const LocalDots& local, const Clustering& clusters,
                       int32_t* out) {
  const int64_t k = clusters.n_chunks;
  PROTOKV_CHECK(k > 0 && local.dots != nullptr && local.reach >= 0 && local.reach < k,
                "local assignment needs chunk prototypes and the chunk pass's local dots");
  const int reach = local.reach;
  const float* prototypes = clusters.prototypes.data();
  // Workspaces reused across calls (one set per thread): every entry is written before it is read.
  thread_local std::vector<int32_t> prototype_of_chunk;
  thread_local std::vector<float> scale, best_score, bucket_cos, bucket_cos_max;
  thread_local std::vector<char> lost_tokens;
  prototype_of_chunk.assign(static_cast<size_t>(k), -1);  // -1: chunk dropped (all irregular)
  for (int i = 0; i < clusters.n_regular; ++i)
    prototype_of_chunk[static_cast<size_t>(clusters.origin[static_cast<size_t>(i)])] = i;
  lost_tokens.assign(static_cast<size_t>(k), 0);
  for (const int32_t t : clusters.irregular)
    lost_tokens[static_cast<size_t>(chunk_of(t, n, k))] = 1;

  // k . c_j = (k . mu_j) / ||mu_j|| for a chunk that kept every token (c_j is the direction of its
  // whole sum); a chunk that lost irregular tokens has its candidates recomputed against c_j.
  scale.assign(static_cast<size_t>(k), 0.0f);
  for (int64_t j = 0; j < k; ++j) {
    const int32_t p = prototype_of_chunk[static_cast<size_t>(j)];
    if (p < 0) continue;
    if (lost_tokens[static_cast<size_t>(j)] != 0) {
      scale[static_cast<size_t>(j)] = 1.0f;
      for (int64_t m = std::max<int64_t>(0, j - reach); m <= std::min(k - 1, j + reach); ++m)
        rows_dot(keys, chunk_begin(m, n, k), chunk_begin(m + 1, n, k), d,
                 prototypes + static_cast<int64_t>(p) * d, local.dots + (j - m + reach) * n);
      continue;
    }
    const int64_t count = chunk_begin(j + 1, n, k) - chunk_begin(j, n, k);
    // 1 / ||mu_j|| = count / ||sum_j||
    const float sum_sq = fast_dot(chunk_sums + j * d, chunk_sums + j * d, d);
    scale[static_cast<size_t>(j)] =
        sum_sq > 0.0f ? static_cast<float>(count) / std::sqrt(sum_sq) : 0.0f;
  }

  // cos(c_j, b) between every chunk prototype and every bucket prototype, for the bound below.
  const int buckets = clusters.n_prototypes() - clusters.n_regular;
  if (buckets > 0) {
    thread_local std::vector<float> with_bucket;  // [n_regular] c_p . b for one bucket b
    with_bucket.resize(static_cast<size_t>(clusters.n_regular));
    bucket_cos.assign(static_cast<size_t>(k * buckets), 1.0f);
    bucket_cos_max.assign(static_cast<size_t>(k), -INFINITY);
    for (int b = 0; b < buckets; ++b) {
      rows_dot(prototypes, 0, clusters.n_regular, d,
               prototypes + static_cast<int64_t>(clusters.n_regular + b) * d, with_bucket.data());
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = prototype_of_chunk[static_cast<size_t>(j)];
        if (p < 0) continue;
        const float cosine = with_bucket[static_cast<size_t>(p)];
        bucket_cos[static_cast<size_t>(j * buckets + b)] = cosine;
        bucket_cos_max[static_cast<size_t>(j)] =
            std::max(bucket_cos_max[static_cast<size_t>(j)], cosine);
      }
    }
  }
  // Tokens some bucket may win: the bound around the best chunk candidate c_j (the smallest angle
  // to the token) says bucket b cannot win where cos(c_j, b) < threshold.
  struct Pending {
    int32_t token;
    int32_t chunk;    // the best chunk candidate's chunk, -1: no bound
    float threshold;  // bucket b cannot win where cos(c_chunk, b) < threshold
  };
  thread_local std::vector<Pending> pending;
  thread_local std::vector<int32_t> best_chunk;
  thread_local std::vector<float> threshold;
  pending.clear();

  // The chunk candidates: first maximum over ascending chunks (= ascending prototype index), then
  // the bucket bound; plain loops over the chunk's tokens (vectorised).
  best_score.resize(static_cast<size_t>(n));
  best_chunk.resize(static_cast<size_t>((n + k - 1) / k));  // the longest chunk
  threshold.resize(best_chunk.size());
  int64_t end = 0;
  for (int64_t m = 0; m < k; ++m) {
    const int64_t begin = end;
    end = chunk_begin(m + 1, n, k);
    const int64_t len = end - begin;
    float* __restrict best = best_score.data() + begin;
    int32_t* __restrict from = best_chunk.data();
    for (int64_t t = 0; t < len; ++t) {
      best[t] = -INFINITY;
      from[t] = -1;
    }
    for (int i = 0; i < local.slots(); ++i) {
      const int64_t j = m - reach + i;
      if (j < 0 || j >= k || prototype_of_chunk[static_cast<size_t>(j)] < 0) continue;
      const float s = scale[static_cast<size_t>(j)];
      const float* __restrict slot = local.dots + static_cast<int64_t>(i) * n + begin;
      for (int64_t t = 0; t < len; ++t) {
        const float value = slot[t] * s;
        const bool better = value > best[t];
        best[t] = better ? value : best[t];
        from[t] = better ? static_cast<int32_t>(j) : from[t];
      }
    }
    for (int64_t t = 0; t < len; ++t)
      out[begin + t] = from[t] >= 0 ? prototype_of_chunk[static_cast<size_t>(from[t])] : -1;
    if (buckets == 0) continue;
    const float* __restrict norm = norms + begin;
    float* __restrict limit = threshold.data();
    for (int64_t t = 0; t < len; ++t) {
      const float cosine = norm[t] > 0.0f ? best[t] / norm[t] : -1.0f;
      limit[t] = from[t] >= 0 && cosine >= 0.0f ? 2.0f * cosine * cosine - 1.0f - kBucketPruneMargin
                                                : -INFINITY;
    }
    for (int64_t t = 0; t < len; ++t) {
      if (limit[t] > -INFINITY && bucket_cos_max[static_cast<size_t>(from[t])] < limit[t])
        continue;  // no bucket can win
      pending.push_back(
          Pending{static_cast<int32_t>(begin + t), limit[t] > -INFINITY ? from[t] : -1, limit[t]});
    }
  }

  // The bucket candidates (higher prototype indices than every chunk), for the pending tokens
  // only: those rows are scattered over the keys, so each is fetched a few tokens ahead.
  int64_t bucket_dots = 0;
  {
    constexpr size_t kAhead = 8;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (i + kAhead < pending.size()) {  // into L2: more rows in flight than L1's fill buffers
        const float* ahead = keys + static_cast<int64_t>(pending[i + kAhead].token) * d;
        for (int c = 0; c < d; c += 16) __builtin_prefetch(ahead + c, 0, 2);
      }
      const Pending& entry = pending[i];
      const float* key = keys + static_cast<int64_t>(entry.token) * d;
      const float* cosines = entry.chunk >= 0
                                 ? bucket_cos.data() + static_cast<int64_t>(entry.chunk) * buckets
                                 : nullptr;
      float& best = best_score[static_cast<size_t>(entry.token)];
      for (int b = 0; b < buckets; ++b) {
        if (cosines != nullptr && cosines[b] < entry.threshold) continue;
        const float value =
            fast_dot(key, prototypes + static_cast<int64_t>(clusters.n_regular + b) * d, d);
        ++bucket_dots;
        if (value > best) {  // the bound still holds: the best only grows
          best = value;
          out[entry.token] = clusters.n_regular + b;
        }
      }
    }
  }
  // No candidate (every chunk in reach dropped and no bucket, or NaN keys): exact Eq. 17.
  for (int64_t t = 0; t < n; ++t)
    if (out[t] < 0)
      assign_to_prototypes(keys + t * d, 1, d, prototypes, clusters.n_prototypes(), out + t);
  return bucket_dots;
}

void ChunkPassStream::start(const float* keys, int64_t n, int d, int64_t k, int local_reach) {
  PROTOKV_CHECK(n >= 1 && k >= 1 && k <= n, "chunk pass: {} chunks of {} keys", k, n);
  PROTOKV_CHECK(local_reach < k, "chunk pass: local reach {} with {} chunks", local_reach, k);
  keys_ = keys;
  n_ = n;
  d_ = d;
  k_ = k;
  done_ = 0;
  // Reused across heads: every entry is written by the chunk pass before it is read.
  norms_.resize(static_cast<size_t>(n));
  sums_.resize(static_cast<size_t>(k * d));
  delta_.resize(static_cast<size_t>(n));
  local_ = LocalDots{};
  if (local_reach >= 0) {
    local_.reach = local_reach;
    local_dots_.resize(static_cast<size_t>(local_.slots() * n));
    local_.dots = local_dots_.data();
  }
}

void ChunkPassStream::advance(int64_t keys_ready) {
  int64_t end = done_;
  while (end < k_ && chunk_begin(end + 1, n_, k_) <= keys_ready) ++end;
  if (end == done_) return;
  chunk_pass_range(keys_, n_, d_, k_, done_, end, norms_.data(), sums_.data(), delta_.data(),
                   local_);
  done_ = end;
}

ChunkPassResult ChunkPassStream::result() {
  advance(n_);  // any chunk the visits left out
  return ChunkPassResult{norms_.data(), sums_.data(), delta_.data(), k_, local_};
}

Clustering cluster_keys(const float* keys, int64_t n, int d, const ClusteringConfig& config,
                        const ChunkPassResult* precomputed) {
  Clustering out;
  out.head_dim = d;
  // Workspaces reused across calls (one set per thread): every entry is written before it is
  // read, so no call pays for fresh zeroed pages.
  thread_local std::vector<float> norms, sums, deviation, local_dots;
  norms.resize(static_cast<size_t>(n));  // [n] ||k_t||

  const int64_t k = std::clamp<int64_t>(config.chunks, 1, n);
  const bool local = config.assignment == Assignment::Local;
  // assign=local's candidate dots for `chunks` chunks, computed by the chunk pass.
  LocalDots local_candidates;
  const auto want_local_dots = [&](int64_t chunks) {
    if (!local) return LocalDots{};
    LocalDots wanted;
    wanted.reach = config.local_reach(chunks);
    local_dots.resize(static_cast<size_t>(wanted.slots() * n));
    wanted.dots = local_dots.data();
    return wanted;
  };
  const float* key_norm = nullptr;
  float* chunk_sums = nullptr;
  // At most k + u prototypes in every prototype set (the LSH ablation: 2^round(log2(k + u)) <
  // 2(k + u)): one allocation instead of repeated growth of a ~256 KB buffer.
  out.prototypes.reserve(static_cast<size_t>(2 * (k + config.buckets()) * d));
  out.origin.reserve(static_cast<size_t>(2 * (k + config.buckets())));
  switch (config.prototypes) {
    case PrototypeSet::Hybrid: {
      // Algorithm 1 lines 1-7: deviation, irregular set O, regular prototypes.
      const bool chunk_dev = config.deviation == Deviation::Chunk;
      const float* delta = nullptr;
      if (precomputed != nullptr && chunk_dev) {
        // The same chunk pass, already run while the window GEMM had the keys in cache.
        PROTOKV_CHECK(precomputed->chunks == k, "precomputed chunk pass has {} chunks, not {}",
                      precomputed->chunks, k);
        PROTOKV_CHECK(!local || (precomputed->local.dots != nullptr &&
                                 precomputed->local.reach == config.local_reach(k)),
                      "precomputed chunk pass lacks assign=local's dots");
        key_norm = precomputed->norms;
        delta = precomputed->delta;
        chunk_sums = precomputed->chunk_sums;
        local_candidates = precomputed->local;
      } else {
        sums.resize(static_cast<size_t>(k * d));  // [k, d] chunk sums
        deviation.resize(static_cast<size_t>(n));
        local_candidates = want_local_dots(k);
        chunk_pass(keys, n, d, k, norms.data(), sums.data(), chunk_dev ? deviation.data() : nullptr,
                   local_candidates);
        if (!chunk_dev)
          neighbourhood_outlier_degree(keys, norms.data(), n, d, config.kappa, deviation.data());
        key_norm = norms.data();
        delta = deviation.data();
        chunk_sums = sums.data();
      }
      out.irregular = top_indices(delta, n, config.irregular);
      add_chunk_prototypes(keys, n, d, k, chunk_sums, out.irregular, out);
      out.n_regular = out.n_prototypes();
      out.n_chunks = k;
      // Lines 8-13: only the irregular tokens are hashed.
      add_bucket_prototypes(keys, key_norm, out.irregular, d, config.lsh_bits, config.gamma,
                            config.lsh_seed, out);
      break;
    }
    case PrototypeSet::Chunk: {
      // Ablation: the same prototype count k + u, all from chunks, no irregular set.
      const int64_t chunks = std::min<int64_t>(n, k + config.buckets());
      sums.resize(static_cast<size_t>(chunks * d));
      local_candidates = want_local_dots(chunks);
      chunk_pass(keys, n, d, chunks, norms.data(), sums.data(), nullptr, local_candidates);
      key_norm = norms.data();
      chunk_sums = sums.data();
      add_chunk_prototypes(keys, n, d, chunks, sums.data(), {}, out);
      out.n_regular = out.n_prototypes();
      out.n_chunks = chunks;
      break;
    }
    case PrototypeSet::Lsh: {
      // Ablation: every prefix key hashed with enough bits for about k + u buckets.
      const int bits = std::clamp(
          static_cast<int>(std::lround(std::log2(static_cast<double>(k + config.buckets())))), 1,
          12);
      key_norms(keys, n, d, norms.data());
      std::vector<int32_t> all(static_cast<size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      add_bucket_prototypes(keys, norms.data(), all, d, bits, config.gamma, config.lsh_seed, out);
      break;
    }
  }
  // Lines 14-17: every token to the prototype of highest cosine.
  out.assignment.resize(static_cast<size_t>(n));
  if (local && out.n_chunks > 0 && out.n_prototypes() > 0)
    out.local_bucket_dots = assign_locally(keys, n, d, key_norm, chunk_sums, local_candidates, out,
                                           out.assignment.data());
  else
    assign_to_prototypes(keys, n, d, out.prototypes.data(), out.n_prototypes(),
                         out.assignment.data());
  return out;
}

}  // namespace protokv::press
