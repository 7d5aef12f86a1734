// SPDX-License-Identifier: Apache-2.0
#pragma once
// The measures `protokv calibrate` writes into a profile and that chelsea and pod compute on the
// prompt itself when no profile is given (DESIGN §5 chelsea, pod). One definition each, shared
// by the calibration command and the presses.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace protokv::press {

// Chelsea (§5, Appendix C), chunked soft matching inside one chunk: the entries
// [begin, end) are rows of `keys` (stride head_dim); offsets 1, 3, 5, ... from `begin` form the
// set A, offsets 0, 2, 4, ... the set B. Every A entry links to the B entry of highest cosine
// similarity (the lowest index on ties; a zero vector has similarity 0 with everything),
// computed in float as the dot product of rows normalised once (norms in double).
struct SoftLink {
  int64_t a = 0;  // entry index (absolute, in [begin, end))
  int64_t b = 0;
  float similarity = 0.0f;
};
// Appends one link per A entry of the chunk to `links`, in A order.
void link_chunk(const float* keys, int head_dim, int64_t begin, int64_t end,
                std::vector<SoftLink>& links);

// Where Chelsea matches: after `sinks` first entries and before the `recent` last ones, in
// consecutive chunks of `chunk` entries (the last one shorter).
struct ChelseaLayout {
  int64_t sinks = 16;
  int64_t recent = 64;
  int64_t chunk = 256;
};

// Outlier-head measure (Chelsea §5, DESIGN §5 chelsea): the share of A entries whose link has
// similarity < `threshold` (0.8 by default), over all chunks of one KV head's keys [n, head_dim].
// 0 when there is nothing to match.
double chelsea_unlinked_share(const float* keys, int64_t n, int head_dim,
                              const ChelseaLayout& layout, double threshold);

// The heads that keep the full cache: the top `fraction` (0.04 by default) of all heads, ranked
// by unlinked share over every [layer][kv_head] together (ties: lower layer, then lower head);
// round(fraction * heads) of them. Returns a mask of the same shape.
std::vector<std::vector<uint8_t>> chelsea_outlier_heads(
    const std::vector<std::vector<float>>& unlinked_share, double fraction);

// PoD (Eq. 2 with DESIGN §5's orientation): similarity of two layers' attention rows =
// the mean over rows of 1 - JS(p, q), with the Jensen-Shannon divergence in base 2 (so in
// [0, 1]). a and b hold `rows` probability rows of `columns` entries each, row-major. The paper
// writes sim as the JS divergence itself, which would make identical layers least similar; the
// grouping threshold (sim >= delta) only makes sense for 1 - JS.
double attention_similarity(std::span<const float> a, std::span<const float> b, int64_t rows,
                            int64_t columns);

// PoD Algorithm 1 (greedy bottom-up grouping) for one head: layer 0 opens the first block; each
// next layer joins the current block when similarity(layer, l) >= delta for every layer l already
// in it, else opens a new block. Returns, per layer, the lowest layer of its block.
std::vector<int> pod_block_starts(int n_layers, const std::function<double(int, int)>& similarity,
                                  double delta);

}  // namespace protokv::press
