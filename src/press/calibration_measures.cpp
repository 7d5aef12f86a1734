#include "press/calibration_measures.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "protokv/error.h"

namespace protokv::press {
namespace {

double norm(const float* x, int d) {
  double s = 0.0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

}  // namespace

void link_chunk(const float* keys, int head_dim, int64_t begin, int64_t end,
                std::vector<SoftLink>& links) {
  if (end - begin < 2) return;
  // cos(a, b) = (a / |a|) . (b / |b|): each row is normalised once (norm in double), then all
  // A x B dot products of the chunk are one sgemm (A rows are the odd rows, B rows the even ones
  // of the normalised chunk: both with a row stride of 2 * head_dim), a quarter of the chunk's
  // c^2 pairs (paper 001 Table 1). Chelsea runs this over the whole middle at every step of every
  // compression, prefill and decode, so it is the press's inner loop.
  thread_local std::vector<float> unit, similarity;
  const int64_t count = end - begin;
  const int64_t n_a = count / 2, n_b = (count + 1) / 2;
  unit.resize(static_cast<size_t>((count + 1) * head_dim));  // + 1 row: B's stride past the end
  for (int64_t i = 0; i < count; ++i) {
    const float* row = keys + (begin + i) * head_dim;
    const double length = norm(row, head_dim);
    const double inverse = length > 0.0 ? 1.0 / length : 0.0;  // a zero row stays zero
    float* out = unit.data() + i * head_dim;
    for (int c = 0; c < head_dim; ++c) out[c] = static_cast<float>(row[c] * inverse);
  }
  similarity.resize(static_cast<size_t>(n_a * n_b));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n_a), static_cast<int>(n_b),
              head_dim, 1.0f, unit.data() + head_dim, 2 * head_dim, unit.data(), 2 * head_dim, 0.0f,
              similarity.data(), static_cast<int>(n_b));
  for (int64_t i = 0; i < n_a; ++i) {
    const float* row = similarity.data() + i * n_b;
    SoftLink best{begin + 2 * i + 1, begin, -2.0f};
    for (int64_t j = 0; j < n_b; ++j)
      if (row[j] > best.similarity) best = {best.a, begin + 2 * j, row[j]};
    links.push_back(best);
  }
}

double chelsea_unlinked_share(const float* keys, int64_t n, int head_dim,
                              const ChelseaLayout& layout, double threshold) {
  const int64_t first = std::min(n, layout.sinks);
  const int64_t last = std::max(first, n - layout.recent);
  std::vector<SoftLink> links;
  for (int64_t begin = first; begin < last; begin += layout.chunk)
    link_chunk(keys, head_dim, begin, std::min(last, begin + layout.chunk), links);
  if (links.empty()) return 0.0;
  const auto unlinked = std::count_if(links.begin(), links.end(), [&](const SoftLink& link) {
    return link.similarity < threshold;
  });
  return static_cast<double>(unlinked) / static_cast<double>(links.size());
}

std::vector<std::vector<uint8_t>> chelsea_outlier_heads(
    const std::vector<std::vector<float>>& unlinked_share, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    fail("chelsea: outlier fraction must be in [0, 1] (got {})", fraction);
  struct Head {
    size_t layer, head;
    float share;
  };
  std::vector<Head> heads;
  std::vector<std::vector<uint8_t>> mask(unlinked_share.size());
  for (size_t l = 0; l < unlinked_share.size(); ++l) {
    mask[l].assign(unlinked_share[l].size(), 0);
    for (size_t h = 0; h < unlinked_share[l].size(); ++h)
      heads.push_back({l, h, unlinked_share[l][h]});
  }
  const auto count =
      static_cast<size_t>(std::llround(fraction * static_cast<double>(heads.size())));
  // stable_sort keeps (layer, head) order among equal shares.
  std::stable_sort(heads.begin(), heads.end(),
                   [](const Head& x, const Head& y) { return x.share > y.share; });
  for (size_t i = 0; i < std::min(count, heads.size()); ++i)
    mask[heads[i].layer][heads[i].head] = 1;
  return mask;
}

double attention_similarity(std::span<const float> a, std::span<const float> b, int64_t rows,
                            int64_t columns) {
  if (rows <= 0 || columns <= 0 || static_cast<int64_t>(a.size()) != rows * columns ||
      static_cast<int64_t>(b.size()) != rows * columns)
    fail("pod: attention rows of different shapes ({} and {} values for {} x {})", a.size(),
         b.size(), rows, columns);
  // JS(p, q) = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2, in bits; 0 log 0 = 0.
  const auto plogp = [](double p) { return p > 0.0 ? p * std::log2(p) : 0.0; };
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double js = 0.0;
    for (int64_t c = 0; c < columns; ++c) {
      const double p = a[static_cast<size_t>(r * columns + c)];
      const double q = b[static_cast<size_t>(r * columns + c)];
      js += 0.5 * (plogp(p) + plogp(q)) - plogp(0.5 * (p + q));
    }
    total += 1.0 - std::clamp(js, 0.0, 1.0);
  }
  return total / static_cast<double>(rows);
}

std::vector<int> pod_block_starts(int n_layers, const std::function<double(int, int)>& similarity,
                                  double delta) {
  std::vector<int> start(static_cast<size_t>(std::max(0, n_layers)), 0);
  int block = 0;
  for (int layer = 1; layer < n_layers; ++layer) {
    bool similar_to_all = true;
    for (int member = block; member < layer && similar_to_all; ++member)
      similar_to_all = similarity(layer, member) >= delta;
    if (!similar_to_all) block = layer;
    start[static_cast<size_t>(layer)] = block;
  }
  return start;
}

}  // namespace protokv::press
