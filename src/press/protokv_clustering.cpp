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

// Appends normalise(sum) to the prototypes unless the sum is zero.
void add_prototype(const float* sum, int d, int32_t origin, Clustering& out) {
  double norm = 0.0;
  for (int c = 0; c < d; ++c) norm += static_cast<double>(sum[c]) * sum[c];
  norm = std::sqrt(norm);
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
  std::vector<int64_t> remaining(static_cast<size_t>(k));
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
void add_bucket_prototypes(const float* keys, const float* norms, const std::vector<int32_t>& rows,
                           int d, int bits, double gamma, uint64_t seed, Clustering& out) {
  const LshProjection lsh = make_lsh_projection(bits, d, gamma, seed);
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

// chunk_pass for head_dim = 16 * kVectors: the chunk's per-channel sums and variances stay in
// registers over its rows (no store and reload per row), the norms and cosines are
// Avx512Ops::dot itself, inlined. The same operations in the same order as the generic loop below
// (per-channel sums in row order, variance terms fused as (k - mu)^2 + var, the channel sum of
// the variances in channel order), so the results are bit-identical to it.
template <int kVectors>
void chunk_pass_avx512(const float* keys, int64_t n, int64_t k, int64_t m_begin, int64_t m_end,
                       float* norms, float* chunk_sums, float* delta) {
  constexpr int d = 16 * kVectors;
  using Ops = kernels::Avx512Ops;
  alignas(64) float mu[d], var[d];
  for (int64_t m = m_begin; m < m_end; ++m) {
    const int64_t begin = chunk_begin(m, n, k), end = chunk_begin(m + 1, n, k);
    __m512 sum[kVectors];
    for (auto& v : sum) v = _mm512_setzero_ps();
    for (int64_t t = begin; t < end; ++t) {
      const float* key = keys + t * d;
      norms[t] = std::sqrt(Ops::dot(key, key, d));
      for (int v = 0; v < kVectors; ++v)
        sum[v] = _mm512_add_ps(sum[v], _mm512_loadu_ps(key + 16 * v));
    }
    float* out_sum = chunk_sums + m * d;
    for (int v = 0; v < kVectors; ++v) _mm512_storeu_ps(out_sum + 16 * v, sum[v]);
    if (delta == nullptr) continue;
    const float inv_count = 1.0f / static_cast<float>(end - begin);
    const __m512 inv = _mm512_set1_ps(inv_count);
    __m512 mean[kVectors], variance[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      mean[v] = _mm512_mul_ps(sum[v], inv);
      variance[v] = _mm512_setzero_ps();
    }
    const int64_t next_end = std::min(n, end + (end - begin));
    for (int64_t t = begin; t < end; ++t) {
      const float* key = keys + t * d;
      // The next chunk's rows, from memory while this one's stay in L1.
      if (t + (end - begin) < next_end)
        for (int line = 0; line < d; line += 16)
          _mm_prefetch(reinterpret_cast<const char*>(key + (end - begin) * d + line), _MM_HINT_T0);
      for (int v = 0; v < kVectors; ++v) {
        const __m512 diff = _mm512_sub_ps(_mm512_loadu_ps(key + 16 * v), mean[v]);
        variance[v] = _mm512_fmadd_ps(diff, diff, variance[v]);
      }
    }
    for (int v = 0; v < kVectors; ++v) {
      _mm512_store_ps(mu + 16 * v, mean[v]);
      _mm512_store_ps(var + 16 * v, variance[v]);
    }
    // 1 - cos(k_t, mu_m) first, then ||sigma_m|| (a chain of d dependent adds, kept in channel
    // order), then the division: the dots need not wait for the chain.
    const float mean_norm = std::sqrt(Ops::dot(mu, mu, d));
    for (int64_t t = begin; t < end; ++t) {
      const float scale = norms[t] * mean_norm;
      const float cosine = scale > 0.0f ? Ops::dot(keys + t * d, mu, d) / scale : 0.0f;
      delta[t] = 1.0f - cosine;
    }
    float sigma_sq = 0.0f;  // ||sigma_m||^2 = sum over channels of the variance
    for (int c = 0; c < d; ++c) sigma_sq += var[c];
    const float sigma_norm = std::sqrt(sigma_sq * inv_count);
    for (int64_t t = begin; t < end; ++t)  // Eq. 10; identical keys (sigma = 0): nothing deviates
      delta[t] = sigma_norm > 0.0f ? delta[t] / sigma_norm : 0.0f;
  }
}

}  // namespace
#endif

void chunk_pass(const float* keys, int64_t n, int d, int64_t k, float* norms, float* chunk_sums,
                float* delta) {
  chunk_pass_range(keys, n, d, k, 0, k, norms, chunk_sums, delta);
}

void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta) {
#if defined(PROTOKV_HAVE_AVX512)
  switch (d) {
    case 64:
      return chunk_pass_avx512<4>(keys, n, k, m_begin, m_end, norms, chunk_sums, delta);
    case 128:
      return chunk_pass_avx512<8>(keys, n, k, m_begin, m_end, norms, chunk_sums, delta);
    case 256:
      return chunk_pass_avx512<16>(keys, n, k, m_begin, m_end, norms, chunk_sums, delta);
    default:
      break;
  }
#endif
  chunk_pass_generic_range(keys, n, d, k, m_begin, m_end, norms, chunk_sums, delta);
}

void chunk_pass_generic(const float* keys, int64_t n, int d, int64_t k, float* norms,
                        float* chunk_sums, float* delta) {
  chunk_pass_generic_range(keys, n, d, k, 0, k, norms, chunk_sums, delta);
}

void chunk_pass_generic_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                              int64_t m_end, float* norms, float* chunk_sums, float* delta) {
  // Per-channel accumulators keep every inner loop a plain vectorisable loop over channels.
  std::vector<float> mean(static_cast<size_t>(d)), variance(static_cast<size_t>(d));
  for (int64_t m = m_begin; m < m_end; ++m) {
    const int64_t begin = chunk_begin(m, n, k), end = chunk_begin(m + 1, n, k);
    float* __restrict sum = chunk_sums + m * d;
    std::fill(sum, sum + d, 0.0f);
    for (int64_t t = begin; t < end; ++t) {
      const float* __restrict key = keys + t * d;
      norms[t] = std::sqrt(kernels::dot(key, key, d));
      for (int c = 0; c < d; ++c) sum[c] += key[c];
    }
    if (delta == nullptr) continue;
    // The chunk's rows are still in cache: per-channel population variance around the mean.
    const float inv_count = 1.0f / static_cast<float>(end - begin);
    float* __restrict mu = mean.data();
    float* __restrict var = variance.data();
    for (int c = 0; c < d; ++c) {
      mu[c] = sum[c] * inv_count;
      var[c] = 0.0f;
    }
    for (int64_t t = begin; t < end; ++t) {
      const float* __restrict key = keys + t * d;
      for (int c = 0; c < d; ++c) var[c] += (key[c] - mu[c]) * (key[c] - mu[c]);
    }
    float sigma_sq = 0.0f;  // ||sigma_m||^2 = sum over channels of the variance
    for (int c = 0; c < d; ++c) sigma_sq += var[c];
    const float sigma_norm = std::sqrt(sigma_sq * inv_count);
    const float mean_norm = std::sqrt(kernels::dot(mu, mu, d));
    for (int64_t t = begin; t < end; ++t) {
      if (!(sigma_norm > 0.0f)) {
        delta[t] = 0.0f;  // identical keys: nothing deviates
        continue;
      }
      const float scale = norms[t] * mean_norm;
      const float cosine = scale > 0.0f ? kernels::dot(keys + t * d, mu, d) / scale : 0.0f;
      delta[t] = (1.0f - cosine) / sigma_norm;  // Eq. 10
    }
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
    for (int64_t t = 0; t < n; ++t) {
      const auto i = static_cast<int32_t>(t);
      if (static_cast<int64_t>(best.size()) == p && !before(i, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), i, before), i);
      if (static_cast<int64_t>(best.size()) > p) best.pop_back();
    }
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
  constexpr int64_t kBlock = 256;
  // k . c for unit prototypes c: cos(k, c) times ||k||, the same argmax over c (so the keys need
  // no normalised copy).
  std::vector<float> cosine(static_cast<size_t>(std::min(n, kBlock) * count));  // [block, count]
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    const int64_t rows = std::min(kBlock, n - t0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), count, d, 1.0f,
                keys + t0 * d, d, prototypes, d, 0.0f, cosine.data(), count);
    for (int64_t r = 0; r < rows; ++r) out[t0 + r] = first_argmax(cosine.data() + r * count, count);
  }
#endif
}

#if defined(PROTOKV_HAVE_AVX2)
namespace {

// assign_locally for up to 8 candidates: the candidates transposed to [d, 8] (zero-padded), one
// 8-lane accumulator per key (8-lane FMAs run on two ports where 16-lane ones often run on one).
// Eight keys at a time give eight independent FMA chains; rows past `end` repeat the last key and
// are dropped. Padding lanes are masked out of the maximum.
void local_dots_8(const float* keys, int64_t begin, int64_t end, int d, const float* prototypes,
                  const std::vector<int32_t>& candidates, int32_t* out) {
  constexpr int kLanes = 8, kRows = 8;
  thread_local std::vector<float> transposed;
  transposed.assign(static_cast<size_t>(d) * kLanes, 0.0f);
  for (size_t i = 0; i < candidates.size(); ++i)
    for (int c = 0; c < d; ++c)
      transposed[static_cast<size_t>(c) * kLanes + i] =
          prototypes[static_cast<int64_t>(candidates[i]) * d + c];
  const auto live = static_cast<int>(candidates.size());
  for (int64_t t0 = begin; t0 < end; t0 += kRows) {
    const float* row[kRows];
    for (int r = 0; r < kRows; ++r) row[r] = keys + std::min(t0 + r, end - 1) * d;
    __m256 acc[kRows];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int c = 0; c < d; ++c) {
      const __m256 column = _mm256_loadu_ps(transposed.data() + static_cast<int64_t>(c) * kLanes);
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(row[r][c]), column, acc[r]);
    }
    alignas(32) float dots[kRows][kLanes];
    for (int r = 0; r < kRows; ++r) _mm256_store_ps(dots[r], acc[r]);  // after the loop
    for (int r = 0; r < kRows && t0 + r < end; ++r) {
      int best = 0;  // first maximum over the live lanes, in candidate (= prototype) order
      for (int i = 1; i < live; ++i)
        if (dots[r][i] > dots[r][best]) best = i;
      out[t0 + r] = candidates[static_cast<size_t>(best)];
    }
  }
}

// The banded form of assign_locally, when prototype j is chunk j's (no chunk dropped) and the
// 2a + 1 chunk slots plus the u bucket slots fit in 8 lanes: lane i < 2a + 1 is chunk m - a + i,
// lane 2a + 1 + b is bucket b. A chunk's columns [d, 8] are one masked load per channel from the
// regular prototypes transposed once per head (regular_t [d, k + 2a], a zero columns on each
// side) OR'ed with the bucket lanes (bucket_t [d, 8], zero in the chunk lanes): no scalar
// transposition per chunk. The dots
// are the same FMA chains over ascending channels as local_dots_8 and the exact GEMM.
struct BandedCandidates {
  std::vector<float> regular_t;  // [d, stride]
  std::vector<float> bucket_t;   // [d, 8]
  std::vector<float> columns;    // [d, 8]: the current chunk's columns
  int64_t stride = 0;            // k + 2a
  int band = 0;                  // 2a + 1 chunk lanes
  int buckets = 0;
};

template <int kRows>
void banded_tile(const float* keys, int64_t n, int64_t t0, int d, const float* columns,
                 float (*dots)[8]) {
  const float* row[kRows];
  for (int r = 0; r < kRows; ++r) row[r] = keys + (t0 + r) * d;
  __m256 acc[kRows];
  for (auto& a : acc) a = _mm256_setzero_ps();
  // The keys stream from memory: fetch the rows two tiles ahead (where they exist), one cache
  // line per row every 16 channels.
  const float* ahead[kRows];
  for (int r = 0; r < kRows; ++r)
    ahead[r] = t0 + r + 2 * kRows < n ? row[r] + 2 * kRows * d : row[r];
  for (int c0 = 0; c0 < d; c0 += 16) {
    for (int r = 0; r < kRows; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + c0), _MM_HINT_T0);
    const int c_end = std::min(d, c0 + 16);
    for (int c = c0; c < c_end; ++c) {
      const __m256 column = _mm256_loadu_ps(columns + static_cast<int64_t>(c) * 8);
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(row[r][c]), column, acc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(dots[r], acc[r]);
}

// Tokens [begin, end) of chunk m: tiles of 8 keys, the last 1-15 keys in one tile of their own
// count (no padded rows).
void banded_chunk(const float* keys, int64_t n, int64_t begin, int64_t end, int d,
                  BandedCandidates& cand, int64_t m, int64_t k, int n_regular, int32_t* out) {
  const int a = cand.band / 2;
  alignas(32) int32_t lane_mask[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int live[8], live_count = 0;
  int32_t prototype[8];
  for (int i = 0; i < cand.band; ++i) {
    const int64_t chunk = m - a + i;
    if (chunk < 0 || chunk >= k) continue;
    lane_mask[i] = -1;
    live[live_count++] = i;
    prototype[i] = static_cast<int32_t>(chunk);
  }
  for (int b = 0; b < cand.buckets; ++b) {
    live[live_count++] = cand.band + b;
    prototype[cand.band + b] = n_regular + b;
  }
  const __m256i chunk_lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_mask));
  // This chunk's candidate columns [d, 8], once: masked-off lanes read nothing and come back as
  // +0.0, so OR keeps the bucket side's bits.
  const float* regular = cand.regular_t.data() + m;
  float* columns = cand.columns.data();
  for (int c = 0; c < d; ++c)
    _mm256_storeu_ps(
        columns + static_cast<int64_t>(c) * 8,
        _mm256_or_ps(
            _mm256_maskload_ps(regular + static_cast<int64_t>(c) * cand.stride, chunk_lanes),
            _mm256_loadu_ps(cand.bucket_t.data() + static_cast<int64_t>(c) * 8)));
  float dots[15][8];
  for (int64_t t0 = begin; t0 < end;) {
    const int64_t left = end - t0;
    const int rows = left >= 16 ? 8 : static_cast<int>(left);
    switch (rows) {
#define PROTOKV_BANDED_CASE(R)                     \
  case R:                                          \
    banded_tile<R>(keys, n, t0, d, columns, dots); \
    break;
      PROTOKV_BANDED_CASE(1)
      PROTOKV_BANDED_CASE(2)
      PROTOKV_BANDED_CASE(3)
      PROTOKV_BANDED_CASE(4)
      PROTOKV_BANDED_CASE(5)
      PROTOKV_BANDED_CASE(6)
      PROTOKV_BANDED_CASE(7)
      PROTOKV_BANDED_CASE(8)
      PROTOKV_BANDED_CASE(9)
      PROTOKV_BANDED_CASE(10)
      PROTOKV_BANDED_CASE(11)
      PROTOKV_BANDED_CASE(12)
      PROTOKV_BANDED_CASE(13)
      PROTOKV_BANDED_CASE(14)
      PROTOKV_BANDED_CASE(15)
#undef PROTOKV_BANDED_CASE
      default:
        break;
    }
    for (int r = 0; r < rows; ++r) {
      int best = live[0];  // first maximum over the live lanes, in prototype order
      for (int i = 1; i < live_count; ++i)
        if (dots[r][live[i]] > dots[r][best]) best = live[i];
      out[t0 + r] = prototype[best];
    }
    t0 += rows;
  }
}

}  // namespace
#endif

void assign_locally(const float* keys, int64_t n, int d, const Clustering& clusters, int neighbours,
                    int32_t* out) {
  const int64_t k = clusters.n_chunks;
  PROTOKV_CHECK(k > 0, "local assignment needs chunk prototypes");
  std::vector<int32_t> prototype_of_chunk(static_cast<size_t>(k), -1);  // -1: chunk dropped
  for (int i = 0; i < clusters.n_regular; ++i)
    prototype_of_chunk[static_cast<size_t>(clusters.origin[static_cast<size_t>(i)])] = i;
  const float* prototypes = clusters.prototypes.data();
#if defined(PROTOKV_HAVE_AVX2)
  const int buckets = clusters.n_prototypes() - clusters.n_regular;
  if (clusters.n_regular == k && neighbours <= 3 && 2 * neighbours + 1 + buckets <= 8) {
    thread_local BandedCandidates cand;
    cand.band = 2 * neighbours + 1;
    cand.buckets = buckets;
    cand.stride = k + 2 * neighbours;
    cand.regular_t.assign(static_cast<size_t>(d * cand.stride), 0.0f);
    for (int64_t j = 0; j < k; ++j)
      for (int c = 0; c < d; ++c)
        cand.regular_t[static_cast<size_t>(c * cand.stride + neighbours + j)] =
            prototypes[j * d + c];
    cand.bucket_t.assign(static_cast<size_t>(d) * 8, 0.0f);
    cand.columns.resize(static_cast<size_t>(d) * 8);
    for (int b = 0; b < buckets; ++b)
      for (int c = 0; c < d; ++c)
        cand.bucket_t[static_cast<size_t>(c) * 8 + static_cast<size_t>(cand.band + b)] =
            prototypes[static_cast<int64_t>(clusters.n_regular + b) * d + c];
    for (int64_t m = 0; m < k; ++m)
      banded_chunk(keys, n, chunk_begin(m, n, k), chunk_begin(m + 1, n, k), d, cand, m, k,
                   clusters.n_regular, out);
    return;
  }
#endif
  std::vector<int32_t> candidates;
  for (int64_t m = 0; m < k; ++m) {
    // Ascending prototype indices, so the first maximum is the lowest index as in Eq. 17 exact.
    candidates.clear();
    for (int64_t j = std::max<int64_t>(0, m - neighbours); j <= std::min(k - 1, m + neighbours);
         ++j)
      if (prototype_of_chunk[static_cast<size_t>(j)] >= 0)
        candidates.push_back(prototype_of_chunk[static_cast<size_t>(j)]);
    for (int i = clusters.n_regular; i < clusters.n_prototypes(); ++i) candidates.push_back(i);
    const int64_t begin = chunk_begin(m, n, k), end = chunk_begin(m + 1, n, k);
    if (candidates.empty()) {
      assign_to_prototypes(keys + begin * d, end - begin, d, prototypes, clusters.n_prototypes(),
                           out + begin);
      continue;
    }
#if defined(PROTOKV_HAVE_AVX2)
    if (candidates.size() <= 8) {
      local_dots_8(keys, begin, end, d, prototypes, candidates, out);
      continue;
    }
#endif
    for (int64_t t = begin; t < end; ++t) {
      const float* key = keys + t * d;
      int32_t best = candidates[0];
      float best_dot = kernels::dot(key, prototypes + static_cast<int64_t>(best) * d, d);
      for (size_t i = 1; i < candidates.size(); ++i) {
        const float dot =
            kernels::dot(key, prototypes + static_cast<int64_t>(candidates[i]) * d, d);
        if (dot > best_dot) best_dot = dot, best = candidates[i];
      }
      out[t] = best;
    }
  }
}

void ChunkPassStream::start(const float* keys, int64_t n, int d, int64_t k) {
  PROTOKV_CHECK(n >= 1 && k >= 1 && k <= n, "chunk pass: {} chunks of {} keys", k, n);
  keys_ = keys;
  n_ = n;
  d_ = d;
  k_ = k;
  done_ = 0;
  // Reused across heads: every entry is written by the chunk pass before it is read.
  norms_.resize(static_cast<size_t>(n));
  sums_.resize(static_cast<size_t>(k * d));
  delta_.resize(static_cast<size_t>(n));
}

void ChunkPassStream::advance(int64_t keys_ready) {
  int64_t end = done_;
  while (end < k_ && chunk_begin(end + 1, n_, k_) <= keys_ready) ++end;
  if (end == done_) return;
  chunk_pass_range(keys_, n_, d_, k_, done_, end, norms_.data(), sums_.data(), delta_.data());
  done_ = end;
}

ChunkPassResult ChunkPassStream::result() {
  advance(n_);  // any chunk the visits left out
  return ChunkPassResult{norms_.data(), sums_.data(), delta_.data(), k_};
}

Clustering cluster_keys(const float* keys, int64_t n, int d, const ClusteringConfig& config,
                        const ChunkPassResult* precomputed) {
  Clustering out;
  out.head_dim = d;
  // Workspaces reused across calls (one set per thread): every entry is written before it is
  // read, so no call pays for fresh zeroed pages.
  thread_local std::vector<float> norms, sums, deviation;
  norms.resize(static_cast<size_t>(n));  // [n] ||k_t||

  const int64_t k = std::clamp<int64_t>(config.chunks, 1, n);
  // At most k + u prototypes in every prototype set (the LSH ablation: 2^round(log2(k + u)) <
  // 2(k + u)): one allocation instead of repeated growth of a ~256 KB buffer.
  out.prototypes.reserve(static_cast<size_t>(2 * (k + config.buckets()) * d));
  out.origin.reserve(static_cast<size_t>(2 * (k + config.buckets())));
  switch (config.prototypes) {
    case PrototypeSet::Hybrid: {
      // Algorithm 1 lines 1-7: deviation, irregular set O, regular prototypes.
      const bool chunk_dev = config.deviation == Deviation::Chunk;
      const float* key_norm = nullptr;
      const float* delta = nullptr;
      float* chunk_sums = nullptr;
      if (precomputed != nullptr && chunk_dev) {
        // The same chunk pass, already run while the window GEMM had the keys in cache.
        PROTOKV_CHECK(precomputed->chunks == k, "precomputed chunk pass has {} chunks, not {}",
                      precomputed->chunks, k);
        key_norm = precomputed->norms;
        delta = precomputed->delta;
        chunk_sums = precomputed->chunk_sums;
      } else {
        sums.resize(static_cast<size_t>(k * d));  // [k, d] chunk sums
        deviation.resize(static_cast<size_t>(n));
        chunk_pass(keys, n, d, k, norms.data(), sums.data(),
                   chunk_dev ? deviation.data() : nullptr);
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
      chunk_pass(keys, n, d, chunks, norms.data(), sums.data(), nullptr);
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
  if (config.assignment == Assignment::Local && out.n_chunks > 0 && out.n_prototypes() > 0)
    assign_locally(keys, n, d, out, config.local_neighbours, out.assignment.data());
  else
    assign_to_prototypes(keys, n, d, out.prototypes.data(), out.n_prototypes(),
                         out.assignment.data());
  return out;
}

}  // namespace protokv::press
