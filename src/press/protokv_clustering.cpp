// SPDX-License-Identifier: Apache-2.0
#include "press/protokv_clustering.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "core/rng.h"
#include "kernels/clustering.h"
#include "kernels/kernels.h"
#include "protokv/error.h"

namespace protokv::press {
namespace {

// Appends normalise(sum) to the prototypes unless the sum is zero.
void add_prototype(const float* sum, int d, int32_t origin, Clustering& out) {
  const double norm = std::sqrt(static_cast<double>(kernels::dot(sum, sum, d)));
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
                           int d, int bits, double gamma, uint64_t seed, bool unit_keys,
                           Clustering& out) {
  const LshProjection& lsh = cached_lsh_projection(bits, d, gamma, seed);
  const int buckets = 1 << bits;
  std::vector<float> sums(static_cast<size_t>(buckets) * static_cast<size_t>(d),
                          0.0f);  // [buckets, d]
  std::vector<int64_t> counts(static_cast<size_t>(buckets), 0);
  std::vector<float> unit(static_cast<size_t>(d));
  for (const int32_t t : rows) {
    const float* key = keys + static_cast<int64_t>(t) * d;
    const float norm = norms[t];
    // Hash the direction (lsh_input=unit) or the key itself (raw, Eq. 12 as written).
    const float inv = !unit_keys ? 1.0f : norm > 0.0f ? 1.0f / norm : 0.0f;
    for (int c = 0; c < d; ++c) unit[static_cast<size_t>(c)] = key[c] * inv;
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

void chunk_pass(const float* keys, int64_t n, int d, int64_t k, float* norms, float* chunk_sums,
                float* delta, const LocalDots& local) {
  kernels::chunk_pass_range(keys, n, d, k, 0, k, norms, chunk_sums, delta, local);
}

void chunk_pass_generic(const float* keys, int64_t n, int d, int64_t k, float* norms,
                        float* chunk_sums, float* delta, const LocalDots& local) {
  kernels::chunk_pass_range(kernels::Isa::kScalar, keys, n, d, k, 0, k, norms, chunk_sums, delta,
                            local);
}

void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local) {
  kernels::chunk_pass_range(keys, n, d, k, m_begin, m_end, norms, chunk_sums, delta, local);
}

void assign_to_prototypes(const float* keys, int64_t n, int d, const float* prototypes, int count,
                          int32_t* out) {
  kernels::assign_to_prototypes(keys, n, d, prototypes, count, out);
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
        kernels::rows_dot(keys, chunk_begin(m, n, k), chunk_begin(m + 1, n, k), d,
                          prototypes + static_cast<int64_t>(p) * d,
                          local.dots + (j - m + reach) * n);
      continue;
    }
    const int64_t count = chunk_begin(j + 1, n, k) - chunk_begin(j, n, k);
    // 1 / ||mu_j|| = count / ||sum_j||
    const float sum_sq = kernels::dot(chunk_sums + j * d, chunk_sums + j * d, d);
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
      kernels::rows_dot(prototypes, 0, clusters.n_regular, d,
                        prototypes + static_cast<int64_t>(clusters.n_regular + b) * d,
                        with_bucket.data());
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
            kernels::dot(key, prototypes + static_cast<int64_t>(clusters.n_regular + b) * d, d);
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
  kernels::chunk_pass_range(keys_, n_, d_, k_, done_, end, norms_.data(), sums_.data(),
                            delta_.data(), local_);
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
                            config.lsh_seed, config.lsh_unit_keys, out);
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
      add_bucket_prototypes(keys, norms.data(), all, d, bits, config.gamma, config.lsh_seed,
                            config.lsh_unit_keys, out);
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
