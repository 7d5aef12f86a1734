// SPDX-License-Identifier: Apache-2.0
// Causal prefill attention, tiled with an online softmax (FlashAttention's recurrence on CPU):
// for each query tile walk the key tiles left to right,
//   S = Q_tile K_tile^T (sgemm), running row max m and row sum l,
//   O = O * exp(m_old - m_new) + exp(S - m_new) V_tile (sgemm),
// and divide by l at the end. Key tiles wholly right of the diagonal are never touched; the
// causal mask is applied only on tiles that cross it. Memory per thread is O(tile), never n×n.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/serial_blas.h"
#include "kernels/simd.h"
#include "kernels/variant.h"
#include "protokv/error.h"

namespace protokv::kernels {
namespace {

// GEMM rows per query tile (query heads of a group × tokens) and keys per key tile: the working
// set (Q, S, O tiles and one K/V tile, ~0.5 MB at d = 128) stays in L2.
constexpr int64_t kQueryTileRows = 128;
constexpr int64_t kKeyTile = 256;

// The query heads of one group and their shared KV head.
struct GroupAttention {
  HeadsView q;  // q.data points at the group's first head
  const float* k;
  int64_t k_stride;
  const float* v;
  int64_t v_stride;
  MutableHeadsView out;      // out.data points at the group's first head
  const float* log_weights;  // nullable, [n_past + n_queries], added to the scaled logits
  int group;
  int d;
  int64_t n_past;
  // Sliding-window attention (Gemma 3's local layers): > 0: a query at position p sees only keys
  // at positions p - window < pos <= p (llama.cpp's LLAMA_SWA_TYPE_STANDARD mask).
  int64_t window = 0;
  // Positions of the n_past + n_queries rows (nullable: row i is at position i, so key tiles
  // wholly left of the window are skipped). Given for a cache whose rows need not be contiguous
  // positions (after compression).
  const int32_t* positions = nullptr;
  bool positions_ascending = false;  // then key tiles wholly left of the window are skipped too
};

int64_t tokens_per_tile(int group) {
  return std::max<int64_t>(1, kQueryTileRows / group);
}

struct TileScratch {
  // Rows: kQueryTileRows, or one token's worth of heads when a group is larger than that.
  TileScratch(int d, int group)
      : rows(tokens_per_tile(group) * group),
        q(static_cast<size_t>(rows * d)),
        s(static_cast<size_t>(rows * kKeyTile)),
        o(static_cast<size_t>(rows * d)),
        row_max(static_cast<size_t>(rows)),
        row_sum(static_cast<size_t>(rows)) {}
  int64_t rows;
  std::vector<float> q;                 // [rows, d] queries of the tile, pre-scaled by 1/sqrt(d)
  std::vector<float> s;                 // [rows, kKeyTile] logits, then unnormalised probabilities
  std::vector<float> o;                 // [rows, d] unnormalised output
  std::vector<float> row_max, row_sum;  // [rows]
};

// Query tokens [t0, t1) of every head of the group. GEMM row r is token t0 + r / group, head
// r % group (token-major, so the causal limit grows with r).
template <class Ops>
void attend_query_tile(const GroupAttention& a, int64_t t0, int64_t t1, TileScratch& scratch) {
  const int g = a.group;
  const int d = a.d;
  const int64_t rows = (t1 - t0) * g;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* q = scratch.q.data();
  float* s = scratch.s.data();
  float* o = scratch.o.data();
  float* row_max = scratch.row_max.data();
  float* row_sum = scratch.row_sum.data();

  for (int64_t r = 0; r < rows; ++r) {
    const float* src = a.q.data + (t0 + r / g) * a.q.token_stride + (r % g) * a.q.head_stride;
    for (int c = 0; c < d; ++c) q[r * d + c] = src[c] * scale;
  }
  std::fill(o, o + rows * d, 0.0f);
  std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
  std::fill(row_sum, row_sum + rows, 0.0f);

  const int64_t key_end = a.n_past + t1;           // the tile's last query sees keys < key_end
  const int64_t unmasked_end = a.n_past + t0 + 1;  // keys every row of the tile sees
  // Keys left of the tile's first query's window are seen by no row of the tile: their tiles are
  // skipped when the rows' positions are known to ascend (always, without explicit positions).
  int64_t key_begin = 0;
  if (a.window > 0) {
    const int64_t first_row = a.n_past + t0;
    if (a.positions == nullptr) {
      key_begin = std::max<int64_t>(0, first_row + 1 - a.window);
    } else if (a.positions_ascending) {
      const int64_t min_position = int64_t{a.positions[first_row]} - a.window + 1;
      key_begin =
          std::lower_bound(a.positions, a.positions + first_row, min_position) - a.positions;
    }
    key_begin = key_begin / kKeyTile * kKeyTile;
  }
  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyTile) {
    const int64_t width = std::min(kKeyTile, key_end - j0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(width), d, 1.0f, q, d, a.k + j0 * a.k_stride,
                static_cast<int>(a.k_stride), 0.0f, s, static_cast<int>(kKeyTile));
    const bool crosses_diagonal = j0 + width > unmasked_end;
    for (int64_t r = 0; r < rows; ++r) {
      float* s_row = s + r * kKeyTile;
      int64_t visible = width;
      if (crosses_diagonal) visible = std::clamp<int64_t>(a.n_past + t0 + r / g + 1 - j0, 0, width);
      if (a.log_weights != nullptr)  // merged cache entries (Chelsea Eq. 2)
        for (int64_t j = 0; j < visible; ++j) s_row[j] += a.log_weights[j0 + j];
      bool any_visible = visible > 0;
      if (a.window > 0 && any_visible) {
        // Keys that left the query's window get logit -inf (probability exactly 0).
        const int64_t row = a.n_past + t0 + r / g;
        const int64_t query_pos = a.positions != nullptr ? a.positions[row] : row;
        any_visible = false;
        for (int64_t j = 0; j < visible; ++j) {
          const int64_t key_pos = a.positions != nullptr ? a.positions[j0 + j] : j0 + j;
          if (query_pos - key_pos >= a.window)
            s_row[j] = -std::numeric_limits<float>::infinity();
          else
            any_visible = true;
        }
        if (!any_visible) visible = 0;
      }
      if (any_visible) {
        const float new_max = std::max(row_max[r], Ops::max(s_row, visible));
        const float correction = Ops::exp(row_max[r] - new_max);  // 0 on the first tile
        row_sum[r] = row_sum[r] * correction + Ops::exp_shifted_sum(s_row, new_max, visible);
        if (correction != 1.0f) Ops::scale(o + r * d, correction, d);
        row_max[r] = new_max;
      }
      std::fill(s_row + visible, s_row + width, 0.0f);  // masked keys get probability 0
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), d,
                static_cast<int>(width), 1.0f, s, static_cast<int>(kKeyTile), a.v + j0 * a.v_stride,
                static_cast<int>(a.v_stride), 1.0f, o, d);
  }

  for (int64_t r = 0; r < rows; ++r) {
    float* dst = a.out.data + (t0 + r / g) * a.out.token_stride + (r % g) * a.out.head_stride;
    const float inv_sum = 1.0f / row_sum[r];  // > 0: every query sees at least its own key
    for (int c = 0; c < d; ++c) dst[c] = o[r * d + c] * inv_sum;
  }
}

// Runs every (KV head, query tile) work item; group_of(kv) describes KV head kv's group.
template <class Ops, class GroupOf>
void attend_groups(int64_t n_queries, int n_heads, int n_kv_heads, int d, GroupOf group_of) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    fail("attention: {} query heads cannot share {} KV heads", n_heads, n_kv_heads);
  if (n_queries <= 0 || n_heads <= 0 || d <= 0) return;
  const int group = n_heads / n_kv_heads;
  const int64_t tile_tokens = tokens_per_tile(group);
  const int64_t n_tiles = (n_queries + tile_tokens - 1) / tile_tokens;
  const int64_t n_items = n_tiles * n_kv_heads;
  // Work items are (KV head, query tile); later tiles see more keys, so they go first for
  // balance under the dynamic schedule.
#pragma omp parallel if (n_items > 1)
  {
    // A no-op in an active region; with a single work item it stops BLAS forking per tile.
    const SerialBlasScope serial_blas;
    TileScratch scratch(d, group);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_items; ++item) {
      const int kv = static_cast<int>(item % n_kv_heads);
      const int64_t tile = n_tiles - 1 - item / n_kv_heads;
      const int64_t t0 = tile * tile_tokens;
      const int64_t t1 = std::min(n_queries, t0 + tile_tokens);
      attend_query_tile<Ops>(group_of(kv, group), t0, t1, scratch);
    }
  }
}

template <class Ops>
void prefill_heads_impl(HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                        int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads, int d,
                        int64_t window) {
  attend_groups<Ops>(n_queries, n_heads, n_kv_heads, d, [&](int kv, int group) {
    const int first_head = kv * group;
    return GroupAttention{
        {q.data + first_head * q.head_stride, q.token_stride, q.head_stride},
        k.data + kv * k.head_stride,
        k.token_stride,
        v.data + kv * v.head_stride,
        v.token_stride,
        {out.data + first_head * out.head_stride, out.token_stride, out.head_stride},
        nullptr,
        group,
        d,
        n_past,
        window};
  });
}

template <class Ops>
void prefill_cached_impl(HeadsView q, std::span<const KvHeadRows> kv_heads, MutableHeadsView out,
                         int64_t n_queries, int n_heads, int d) {
  const auto n_kv_heads = static_cast<int>(kv_heads.size());
  attend_groups<Ops>(n_queries, n_heads, n_kv_heads, d, [&](int kv, int group) {
    const int first_head = kv * group;
    const KvHeadRows& rows = kv_heads[static_cast<size_t>(kv)];
    return GroupAttention{
        {q.data + first_head * q.head_stride, q.token_stride, q.head_stride},
        rows.k,
        rows.token_stride,
        rows.v,
        rows.token_stride,
        {out.data + first_head * out.head_stride, out.token_stride, out.head_stride},
        rows.log_weights,
        group,
        d,
        rows.n_past,
        rows.window,
        rows.positions,
        rows.positions_ascending};
  });
}

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void attention_prefill_heads(HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window) {
  prefill_heads_impl<VariantOps>(q, k, v, out, n_queries, n_past, n_heads, n_kv_heads, head_dim,
                                 window);
}

void attention_prefill_cached(HeadsView q, std::span<const KvHeadRows> kv_heads,
                              MutableHeadsView out, int64_t n_queries, int n_heads, int head_dim) {
  prefill_cached_impl<VariantOps>(q, kv_heads, out, n_queries, n_heads, head_dim);
}

void attention_prefill(const float* q, const float* k, const float* v, int64_t n, int d,
                       float* out) {
  if (n <= 0 || d <= 0) return;
  const GroupAttention a{{q, d, d}, k, d, v, d, {out, d, d}, nullptr, 1, d, 0};
  const SerialBlasScope serial_blas;  // documented single-threaded, BLAS included
  TileScratch scratch(d, 1);
  const int64_t tile_tokens = tokens_per_tile(1);
  for (int64_t t0 = 0; t0 < n; t0 += tile_tokens)
    attend_query_tile<VariantOps>(a, t0, std::min(n, t0 + tile_tokens), scratch);
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
