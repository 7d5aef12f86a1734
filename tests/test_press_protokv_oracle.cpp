// SPDX-License-Identifier: Apache-2.0
// ProtoKV against an independent oracle: the paper's equations written out naively in double
// precision (ProtoKV Eqs. 4-5, 10-18, Algorithm 1; ICLR-version variants), sharing no code with
// src/press/ except the random draws of the LSH projection (make_lsh_projection, whose
// distribution and reproducibility are tested on their own). Also the Eq. 17 argmax against a
// naive first-maximum for prototype counts around the 16-lane boundaries, with planted ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/clustering.h"
#include "press/protokv.h"
#include "press/protokv_clustering.h"
#include "protokv/press/options.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;
using Rows = std::vector<std::vector<double>>;

// ---------------------------------------------------------------- Eq. 17 argmax, planted ties

// First index of the largest exact dot product (integer-valued inputs: every sum is exact).
int naive_first_argmax(const std::vector<float>& key, const std::vector<float>& protos, int count,
                       int d) {
  int best = 0;
  double best_dot = -INFINITY;
  for (int p = 0; p < count; ++p) {
    double dot = 0.0;
    for (int c = 0; c < d; ++c)
      dot +=
          static_cast<double>(key[static_cast<size_t>(c)]) * protos[static_cast<size_t>(p * d + c)];
    if (dot > best_dot) best_dot = dot, best = p;
  }
  return best;
}

TEST(ProtoKvAssignmentOracle, ArgmaxMatchesNaiveFirstMaximumAroundLaneBoundariesWithTies) {
  constexpr int kDim = 72;
  for (const int count : {15, 16, 17, 31, 32, 33, 64}) {
    SCOPED_TRACE("prototypes " + std::to_string(count));
    // Prototype p is the one-hot e_p, except planted duplicates: the last prototype and the last
    // lane of the first 16-lane block repeat earlier ones, so their keys tie exactly and the
    // lower index must win.
    std::vector<int> axis(static_cast<size_t>(count));
    std::iota(axis.begin(), axis.end(), 0);
    axis[static_cast<size_t>(count - 1)] = count > 17 ? count - 17 : 0;
    if (count > 16) axis[15] = 1;
    std::vector<float> protos(static_cast<size_t>(count * kDim), 0.0f);
    for (int p = 0; p < count; ++p)
      protos[static_cast<size_t>(p * kDim + axis[static_cast<size_t>(p)])] = 1.0f;

    std::mt19937_64 rng(static_cast<uint64_t>(count));
    std::uniform_int_distribution<int> small(-2, 2);
    std::vector<std::vector<float>> keys;
    // One key aimed at each prototype's axis (the unique maximum unless planted as a duplicate).
    for (int p = 0; p < count; ++p) {
      std::vector<float> key(kDim);
      for (float& x : key) x = static_cast<float>(small(rng));
      key[static_cast<size_t>(axis[static_cast<size_t>(p)])] = 5.0f;
      keys.push_back(key);
    }
    // Keys with every axis equal (a tie across all lanes) and one with the maximum only in the
    // last prototype's own axis, then small random integers: many ties across lanes.
    keys.emplace_back(kDim, 1.0f);
    {
      std::vector<float> key(kDim, -1.0f);
      key[static_cast<size_t>(count - 1)] = 3.0f;  // e_{count-1}: only if it is not a duplicate
      keys.push_back(key);
    }
    while (keys.size() < 300) {  // more than one 256-row block
      std::vector<float> key(kDim);
      for (float& x : key) x = static_cast<float>(small(rng));
      keys.push_back(key);
    }
    std::vector<float> flat;
    for (const auto& key : keys) flat.insert(flat.end(), key.begin(), key.end());
    std::vector<int32_t> assignment(keys.size());
    press::assign_to_prototypes(flat.data(), static_cast<int64_t>(keys.size()), kDim, protos.data(),
                                count, assignment.data());
    for (const kernels::Isa isa : kernels::available_isas()) {  // every variant alike
      std::vector<int32_t> other(assignment.size());
      kernels::assign_to_prototypes(isa, flat.data(), static_cast<int64_t>(keys.size()), kDim,
                                    protos.data(), count, other.data());
      EXPECT_EQ(other, assignment) << kernels::isa_name(isa);
    }
    int ties = 0;
    for (size_t t = 0; t < keys.size(); ++t) {
      const int expected = naive_first_argmax(keys[t], protos, count, kDim);
      EXPECT_EQ(assignment[t], expected) << "key " << t;
      int maxima = 0;
      for (int p = 0; p < count; ++p)
        maxima += keys[t][static_cast<size_t>(axis[static_cast<size_t>(p)])] ==
                          keys[t][static_cast<size_t>(axis[static_cast<size_t>(expected)])]
                      ? 1
                      : 0;
      ties += maxima > 1 ? 1 : 0;
    }
    EXPECT_GT(ties, 20);  // the planted ties are really there
    // Every prototype that is not a duplicate wins its own key, the last lane included.
    for (int p = 0; p < count; ++p) {
      const bool duplicate = std::find(axis.begin(), axis.begin() + p,
                                       axis[static_cast<size_t>(p)]) != axis.begin() + p;
      if (!duplicate) {
        EXPECT_EQ(assignment[static_cast<size_t>(p)], p);
      }
    }
  }
}

// ---------------------------------------------------------------- naive ProtoKV

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double norm(const std::vector<double>& a) {
  return std::sqrt(dot(a, a));
}
double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  const double s = norm(a) * norm(b);
  return s > 0.0 ? dot(a, b) / s : 0.0;
}

// Eq. 4: per query head g of the group, s_g(j) = sum over the last w queries i of
// softmax_j(q_i . k_j / sqrt(d)) over the causal row j <= i; prefix keys only.
Rows window_attention(const SyntheticLayer& layer, int h, int64_t w) {
  const int group = layer.n_heads / layer.n_kv_heads;
  const int64_t prefix = layer.n - w;
  Rows out(static_cast<size_t>(group), std::vector<double>(static_cast<size_t>(prefix), 0.0));
  for (int g = 0; g < group; ++g) {
    const int qh = h * group + g;
    for (int64_t i = prefix; i < layer.n; ++i) {
      std::vector<double> logit(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0.0;
        for (int c = 0; c < layer.d; ++c)
          s += static_cast<double>(layer.q[static_cast<size_t>((qh * layer.n + i) * layer.d + c)]) *
               layer.k[static_cast<size_t>((h * layer.n + j) * layer.d + c)];
        logit[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(layer.d));
      }
      const double top = *std::max_element(logit.begin(), logit.end());
      double z = 0.0;
      for (double& x : logit) z += (x = std::exp(x - top));
      for (int64_t j = 0; j < prefix; ++j)
        out[static_cast<size_t>(g)][static_cast<size_t>(j)] += logit[static_cast<size_t>(j)] / z;
    }
  }
  return out;
}

// Eq. 5: stride-1 pooling with padding kernel/2 (max ignores the padding, avg counts it).
std::vector<double> pool(const std::vector<double>& x, int kernel, bool max_pool) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<double> out(x.size());
  for (int64_t j = 0; j < n; ++j) {
    double acc = max_pool ? -INFINITY : 0.0;
    for (int64_t i = j - kernel / 2; i <= j + kernel / 2; ++i) {
      if (i < 0 || i >= n) continue;
      acc = max_pool ? std::max(acc, x[static_cast<size_t>(i)]) : acc + x[static_cast<size_t>(i)];
    }
    out[static_cast<size_t>(j)] = max_pool ? acc : acc / kernel;
  }
  return out;
}

// The token's own score: pooled window attention reduced over the group, or (score=sum_logits)
// (sum of the group's window queries) . k_t.
std::vector<double> own_scores(const SyntheticLayer& layer, int h, const press::ProtoKvConfig& c) {
  const int64_t w = c.window_scores.window, prefix = layer.n - w;
  const int group = layer.n_heads / layer.n_kv_heads;
  std::vector<double> own(static_cast<size_t>(prefix), 0.0);
  if (c.score == press::ClusterScore::SumLogits) {
    for (int64_t t = 0; t < prefix; ++t)
      for (int g = 0; g < group; ++g)
        for (int64_t i = prefix; i < layer.n; ++i)
          for (int d = 0; d < layer.d; ++d)
            own[static_cast<size_t>(t)] +=
                static_cast<double>(
                    layer.q[static_cast<size_t>(((h * group + g) * layer.n + i) * layer.d + d)]) *
                layer.k[static_cast<size_t>((h * layer.n + t) * layer.d + d)];
    return own;
  }
  const Rows sums = window_attention(layer, h, w);
  for (int g = 0; g < group; ++g) {
    const auto pooled = c.window_scores.pool > 1
                            ? pool(sums[static_cast<size_t>(g)], c.window_scores.pool,
                                   c.window_scores.pool_type == press::PoolType::Max)
                            : sums[static_cast<size_t>(g)];
    for (int64_t t = 0; t < prefix; ++t) {
      double& o = own[static_cast<size_t>(t)];
      const double v = pooled[static_cast<size_t>(t)];
      o = c.window_scores.gqa == press::GqaReduce::Max ? (g == 0 ? v : std::max(o, v)) : o + v;
    }
  }
  if (c.window_scores.gqa == press::GqaReduce::Mean)
    for (double& o : own) o /= group;
  return own;
}

// Indices of the p largest values, ties to the lower index.
std::vector<int64_t> top_p(const std::vector<double>& v, int64_t p) {
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(std::min<int64_t>(p, static_cast<int64_t>(v.size()))));
  return order;
}

// Eqs. 12-14 on a unit key: bit i = [cos(w_i . k + b_i) > 0], first bit most significant.
int bucket_of(const press::LshProjection& lsh, const std::vector<double>& unit) {
  int code = 0;
  for (int i = 0; i < lsh.bits; ++i) {
    double s = lsh.phase[static_cast<size_t>(i)];
    for (int c = 0; c < lsh.head_dim; ++c)
      s += lsh.w[static_cast<size_t>(i * lsh.head_dim + c)] * unit[static_cast<size_t>(c)];
    code = code * 2 + (std::cos(s) > 0.0 ? 1 : 0);
  }
  return code;
}

// Algorithm 1 lines 1-17 for one KV head: every prefix token's prototype index.
std::vector<int> naive_clusters(const Rows& keys, const press::ProtoKvConfig& c, int layer_index,
                                int h) {
  const auto n = static_cast<int64_t>(keys.size());
  const int d = static_cast<int>(keys[0].size());
  int64_t k = c.chunks > 0
                  ? c.chunks
                  : std::clamp<int64_t>(
                        std::llround(static_cast<double>(n) / static_cast<double>(c.chunk_len)), 1,
                        c.max_chunks);
  k = std::min(k, n);
  const int u = 1 << c.lsh_bits;
  Rows prototypes;
  std::vector<bool> irregular(static_cast<size_t>(n), false);
  auto add = [&](const std::vector<int64_t>& members) {
    if (members.empty()) return;
    std::vector<double> sum(static_cast<size_t>(d), 0.0);
    for (int64_t t : members)
      for (int i = 0; i < d; ++i)
        sum[static_cast<size_t>(i)] += keys[static_cast<size_t>(t)][static_cast<size_t>(i)];
    const double s = norm(sum);
    if (!(s > 0.0)) return;
    for (double& x : sum) x /= s;
    prototypes.push_back(sum);
  };
  // Chunk m of K: [m n / K, (m + 1) n / K).
  auto chunk_members = [&](int64_t m, int64_t chunks) {
    std::vector<int64_t> members;
    for (int64_t t = m * n / chunks; t < (m + 1) * n / chunks; ++t)
      if (!irregular[static_cast<size_t>(t)]) members.push_back(t);
    return members;
  };
  auto add_buckets = [&](const std::vector<int64_t>& tokens, int bits) {
    const auto lsh =
        press::make_lsh_projection(bits, d, c.gamma, press::lsh_seed_for(c.seed, layer_index, h));
    std::vector<std::vector<int64_t>> buckets(static_cast<size_t>(1) << bits);
    for (int64_t t : tokens) {
      std::vector<double> unit = keys[static_cast<size_t>(t)];
      const double s = norm(unit);
      for (double& x : unit) x = s > 0.0 ? x / s : 0.0;
      buckets[static_cast<size_t>(bucket_of(lsh, unit))].push_back(t);
    }
    for (const auto& b : buckets) add(b);  // Eq. 15, empty buckets dropped
  };

  if (c.prototypes == press::PrototypeSet::Hybrid) {
    std::vector<double> deviation(static_cast<size_t>(n));
    if (c.deviation == press::Deviation::Chunk) {
      for (int64_t m = 0; m < k; ++m) {  // Eq. 10
        const int64_t begin = m * n / k, end = (m + 1) * n / k;
        std::vector<double> mu(static_cast<size_t>(d), 0.0), var(static_cast<size_t>(d), 0.0);
        for (int64_t t = begin; t < end; ++t)
          for (int i = 0; i < d; ++i)
            mu[static_cast<size_t>(i)] += keys[static_cast<size_t>(t)][static_cast<size_t>(i)] /
                                          static_cast<double>(end - begin);
        for (int64_t t = begin; t < end; ++t)
          for (int i = 0; i < d; ++i) {
            const double e =
                keys[static_cast<size_t>(t)][static_cast<size_t>(i)] - mu[static_cast<size_t>(i)];
            var[static_cast<size_t>(i)] += e * e / static_cast<double>(end - begin);
          }
        double sigma = 0.0;
        for (double v : var) sigma += v;  // ||sigma||^2 = sum of per-channel variances
        sigma = std::sqrt(sigma);
        for (int64_t t = begin; t < end; ++t)
          deviation[static_cast<size_t>(t)] =
              sigma > 0.0 ? (1.0 - cosine(keys[static_cast<size_t>(t)], mu)) / sigma : 0.0;
      }
    } else {  // ProtoKV's ICLR version: Theta = -zscore(mean cosine to the neighbours within kappa)
      std::vector<double> similarity(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0.0;
        int count = 0;
        for (int64_t j = i - c.kappa; j <= i + c.kappa; ++j) {
          if (j < 0 || j >= n || j == i) continue;
          sum += cosine(keys[static_cast<size_t>(i)], keys[static_cast<size_t>(j)]);
          ++count;
        }
        similarity[static_cast<size_t>(i)] = count > 0 ? sum / count : 1.0;
      }
      double mean = 0.0, var = 0.0;
      for (double s : similarity) mean += s / static_cast<double>(n);
      for (double s : similarity) var += (s - mean) * (s - mean) / static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i)
        deviation[static_cast<size_t>(i)] =
            var > 0.0 ? -(similarity[static_cast<size_t>(i)] - mean) / std::sqrt(var) : 0.0;
    }
    const auto outliers = top_p(deviation, std::min<int64_t>(c.irregular, n));
    for (int64_t t : outliers) irregular[static_cast<size_t>(t)] = true;
    for (int64_t m = 0; m < k; ++m) add(chunk_members(m, k));  // Eq. 11
    std::vector<int64_t> sorted(outliers.begin(), outliers.end());
    std::sort(sorted.begin(), sorted.end());
    add_buckets(sorted, c.lsh_bits);  // Eqs. 12-15
  } else if (c.prototypes == press::PrototypeSet::Chunk) {
    const int64_t chunks = std::min<int64_t>(n, k + u);
    for (int64_t m = 0; m < chunks; ++m) add(chunk_members(m, chunks));
  } else {
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    const int bits =
        std::clamp(static_cast<int>(std::lround(std::log2(static_cast<double>(k + u)))), 1, 12);
    add_buckets(all, bits);
  }
  // Eq. 17: highest cosine, ties to the lower prototype.
  std::vector<int> assignment(static_cast<size_t>(n), 0);
  for (int64_t t = 0; t < n; ++t) {
    double best = -INFINITY;
    for (size_t p = 0; p < prototypes.size(); ++p) {
      const double cs = cosine(keys[static_cast<size_t>(t)], prototypes[p]);
      if (cs > best) best = cs, assignment[static_cast<size_t>(t)] = static_cast<int>(p);
    }
  }
  return assignment;
}

// Eq. 18 and the selection: kept token indices of KV head h, window included, ascending.
std::vector<int32_t> naive_protokv_kept(const SyntheticLayer& layer, int h,
                                        const press::ProtoKvConfig& c, int64_t budget) {
  const int64_t w = c.window_scores.window, prefix = layer.n - w;
  Rows keys(static_cast<size_t>(prefix), std::vector<double>(static_cast<size_t>(layer.d)));
  for (int64_t t = 0; t < prefix; ++t)
    for (int i = 0; i < layer.d; ++i)
      keys[static_cast<size_t>(t)][static_cast<size_t>(i)] =
          layer.k[static_cast<size_t>((h * layer.n + t) * layer.d + i)];
  const std::vector<int> cluster = naive_clusters(keys, c, layer.layer, h);
  const std::vector<double> own = own_scores(layer, h, c);
  std::map<int, double> sum;
  std::map<int, int64_t> size;
  for (int64_t t = 0; t < prefix; ++t) {
    sum[cluster[static_cast<size_t>(t)]] += own[static_cast<size_t>(t)];
    ++size[cluster[static_cast<size_t>(t)]];
  }
  auto score = [&](int a) {
    return c.score == press::ClusterScore::Mean ? sum[a] / static_cast<double>(size[a]) : sum[a];
  };
  std::vector<int32_t> order(static_cast<size_t>(prefix));
  std::iota(order.begin(), order.end(), 0);
  const bool whole = c.select == press::Selection::Clusters;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int ca = cluster[static_cast<size_t>(a)], cb = cluster[static_cast<size_t>(b)];
    const double sa = score(ca), sb = score(cb);
    if (sa != sb) return sa > sb;
    if (whole && ca != cb) return ca < cb;
    return own[static_cast<size_t>(a)] > own[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(budget - w));
  for (int64_t j = prefix; j < layer.n; ++j) order.push_back(static_cast<int32_t>(j));
  std::sort(order.begin(), order.end());
  return order;
}

class ProtoKvVariants : public ::testing::TestWithParam<std::string> {};

TEST_P(ProtoKvVariants, KeptSetEqualsTheNaiveImplementationOfThePaper) {
  constexpr int64_t kBudget = 40;
  SyntheticLayer layer(300, 4, 2, 16);
  layer.layer = 2;
  layer.n_layers = 4;
  layer.fill_random(17, 2.0f);
  const std::string options = GetParam();
  press::OptionReader reader("protokv", options, press::protokv_option_specs());
  const press::ProtoKvConfig config = press::read_protokv_options(reader);
  auto press = make_press("protokv:" + options);
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  for (int h = 0; h < 2; ++h)
    EXPECT_EQ(testing::kept_positions(cache.heads[static_cast<size_t>(h)]),
              naive_protokv_kept(layer, h, config, kBudget))
        << options << " head " << h;
}

INSTANTIATE_TEST_SUITE_P(Press, ProtoKvVariants,
                         ::testing::Values("seed=0", "pool=7", "select=clusters",
                                           "score=sum_logits", "score=sum_logits,select=clusters",
                                           "deviation=neighbourhood,irregular=20",
                                           "prototypes=chunk", "prototypes=lsh,seed=5",
                                           "chunks=7,lsh_bits=3,pool=5,pool_type=avg,gqa=max",
                                           "chunks=40,gqa=sum"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return "variant" + std::to_string(info.index);
                         });

}  // namespace
}  // namespace protokv
