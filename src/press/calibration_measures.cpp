// SPDX-License-Identifier: Apache-2.0
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

// Writes rows [0, count) of `rows` ([count, d]) divided by their norm() to `out` (a zero row stays
// zero). Eight rows at a time, each summed in its own order exactly as norm() does (the result is
// bit-identical): the eight independent chains hide the latency of the double additions, which a
// row on its own is bound by.
void normalise_rows(const float* rows, int64_t count, int d, float* out) {
  constexpr int kRows = 8;
  const auto write = [&](int64_t i, double length) {
    const double inverse = length > 0.0 ? 1.0 / length : 0.0;
    const float* row = rows + i * d;
    float* unit = out + i * d;
    for (int c = 0; c < d; ++c) unit[c] = static_cast<float>(row[c] * inverse);
  };
  int64_t i0 = 0;
  for (; i0 + kRows <= count; i0 += kRows) {
    double sums[kRows] = {};
    const float* block = rows + i0 * d;
    for (int c = 0; c < d; ++c)
      for (int r = 0; r < kRows; ++r) {
        const float x = block[r * d + c];
        sums[r] += static_cast<double>(x) * x;
      }
    for (int r = 0; r < kRows; ++r) write(i0 + r, std::sqrt(sums[r]));
  }
  for (; i0 < count; ++i0) write(i0, norm(rows + i0 * d, d));
}

// Where a serial scan `if (row[j] > best) best = row[j]` from best = `floor` ends: the first
// maximum (NaN never wins), or -1 when nothing exceeds `floor`. Found with 16 independent lanes
// and one search instead of a chain of n dependent comparisons; +0 and -0 compare equal, so the
// search finds the first of either, as the scan does.
int64_t first_maximum(const float* row, int64_t n, float floor) {
  constexpr int kLanes = 16;
  float lanes[kLanes];
  for (float& lane : lanes) lane = floor;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] = row[j + l] > lanes[l] ? row[j + l] : lanes[l];
  float best = floor;
  for (float lane : lanes) best = lane > best ? lane : best;
  for (; j < n; ++j) best = row[j] > best ? row[j] : best;
  if (!(best > floor)) return -1;
  for (j = 0; j < n; ++j)
    if (row[j] == best) return j;
  return -1;
}

}  // namespace

void link_chunk(const float* keys, int head_dim, int64_t begin, int64_t end,
                std::vector<SoftLink>& links) {
  if (end - begin < 2) return;
  // cos(a, b) = (a / |a|) . (b / |b|): each row is normalised once (norm in double), then all
  // A x B dot products of the chunk are one sgemm (A rows are the odd rows, B rows the even ones
  // of the normalised chunk: both with a row stride of 2 * head_dim), a quarter of the chunk's
  // c^2 pairs (Chelsea Table 1). Chelsea runs this over the whole middle at every step of every
  // compression, prefill and decode, so it is the press's inner loop.
  thread_local std::vector<float> unit, similarity;
  const int64_t count = end - begin;
  const int64_t n_a = count / 2, n_b = (count + 1) / 2;
  unit.resize(static_cast<size_t>((count + 1) * head_dim));  // + 1 row: B's stride past the end
  normalise_rows(keys + begin * head_dim, count, head_dim, unit.data());
  similarity.resize(static_cast<size_t>(n_a * n_b));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n_a), static_cast<int>(n_b),
              head_dim, 1.0f, unit.data() + head_dim, 2 * head_dim, unit.data(), 2 * head_dim, 0.0f,
              similarity.data(), static_cast<int>(n_b));
  for (int64_t i = 0; i < n_a; ++i) {
    const float* row = similarity.data() + i * n_b;
    // The most similar B, the first one on ties; {begin, -2} when none is above -2 (NaN).
    const int64_t j = first_maximum(row, n_b, -2.0f);
    links.push_back(j < 0 ? SoftLink{begin + 2 * i + 1, begin, -2.0f}
                          : SoftLink{begin + 2 * i + 1, begin + 2 * j, row[j]});
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
