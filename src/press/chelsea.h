// SPDX-License-Identifier: Apache-2.0
#pragma once
// Chelsea (§5 and Appendix C, DESIGN §5 chelsea): training-free KV-cache clustering by
// Chunked Soft Matching. Per KV head, the first `sinks` and the last `recent` entries stay as they
// are; the middle is cut into chunks of `chunk` entries; inside each chunk the odd offsets (A)
// link to their most cosine-similar even offset (B) (link_chunk, calibration_measures.h); the
// most similar links over all chunks are merged: each B entry and every A linked to it become one
// entry whose key and value are the degree-weighted means (weights = current degrees n_t), whose
// degree is the sum and whose attention logit gets + log(degree) through the cache's log-weight
// (Chelsea Eq. 2). Steps repeat, with the ratio schedule r = r_init - alpha * min(m, i) (Appendix
// C), until the head fits its budget B; during decode the same runs again each time the head
// reaches B + interval entries. Outlier heads (a mask from a calibration profile, or measured on
// the prompt) keep the full cache.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "press/calibration_measures.h"
#include "press/calibration_profile.h"
#include "press/entry.h"
#include "protokv/press.h"

namespace protokv::press {

// Appendix C: the share of the middle merged away at clustering step i (from 0) of one
// compression, r = r_init - alpha * min(m, i), capped at 0.5 (a step merges at most every A) and
// kept above 0 (a schedule that reaches 0 stays at its last positive value).
struct ChelseaSchedule {
  double r_init = 0.35;
  double alpha = 0.1;
  int steps = 2;  // m
  double ratio(int step) const;
};

// The paper's per-family values (Appendix C): llama2 0.45/0.05/3, llama3 0.35/0.1/2,
// qwen 0.2/0.1/2. Throws Error for another name.
ChelseaSchedule chelsea_schedule_preset(const std::string& name);

// One KV head while Chelsea merges it: entries in cache order with their keys, values, the
// position each entry is stored under (an ordinary token's own; a merged entry's B token's) and
// the token positions each entry stands for (CSR: members of entry e are
// members[member_offsets[e] .. member_offsets[e + 1]), ascending). degree(e) = member count.
struct MergedHead {
  int head_dim = 0;
  std::vector<float> keys;    // [size, head_dim]
  std::vector<float> values;  // [size, head_dim]
  std::vector<int32_t> positions;
  std::vector<int64_t> member_offsets{0};
  std::vector<int32_t> members;

  int64_t size() const { return static_cast<int64_t>(positions.size()); }
  int64_t degree(int64_t e) const {
    return member_offsets[static_cast<size_t>(e) + 1] - member_offsets[static_cast<size_t>(e)];
  }
  // Appends an entry standing for `member_positions` (ascending; one: an ordinary token).
  void append(const float* key, const float* value, int32_t position,
              std::span<const int32_t> member_positions);
};

// One Chunked Soft Matching step (Chelsea §5.2-5.3): links every A to its best B in each chunk
// of the middle, keeps the min(floor(ratio * middle), max_merges, links) most similar links over
// all chunks (at least one while max_merges > 0; ties: the lower A first) and merges each B with
// its linked A entries. Returns the number of entries removed.
int64_t chelsea_merge_step(MergedHead& head, const ChelseaLayout& layout, double ratio,
                           int64_t max_merges);

// Merge steps (step i uses schedule.ratio(i)) until the head holds at most `budget` entries.
void chelsea_compress(MergedHead& head, const ChelseaLayout& layout,
                      const ChelseaSchedule& schedule, int64_t budget);

struct ChelseaOptions {
  static constexpr int64_t kDefaultInterval = 64;  // g: the paper gives no value
  static constexpr double kDefaultOutliers = 0.04;
  static constexpr double kDefaultThreshold = 0.8;

  ChelseaLayout layout;  // sinks 16, recent 64, chunk 256
  int64_t interval = kDefaultInterval;
  std::string schedule_name = "llama3";
  ChelseaSchedule schedule;
  double outliers = kDefaultOutliers;    // fraction of heads that keep the full cache
  double threshold = kDefaultThreshold;  // link similarity below which an A counts as unlinked
  // Chelsea App. C.2: the outlier heads' full caches are paid out of the other heads' budgets, so
  // that all heads together hold layers x KV heads x B entries, as every other method at B.
  // false: the other heads keep B each (the outlier heads come on top).
  bool reallocate = true;
  // The seam for a calibration profile (`protokv calibrate`): outlier_heads[layer][kv_head] != 0
  // keeps that head's full cache. Unset: measured on the prompt, layer by layer (see help).
  std::optional<std::vector<std::vector<uint8_t>>> outlier_heads;
  // The profile outlier_heads came from (`profile=FILE`), checked against the model at begin().
  const CalibrationProfile* profile = nullptr;
  std::string profile_path;
};

class ChelseaPress final : public Press {
 public:
  explicit ChelseaPress(ChelseaOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "chelsea"; }
  nlohmann::json config() const override;
  void begin(const SequenceInfo& info, const Budget& budget) override;
  void compress_prefill(const LayerView& layer, LayerCache& out) override;
  // Re-runs the compression of every merging head of this layer that reached B + interval.
  void on_decode(const DecodeStep& step) override;
  std::span<const int32_t> merged_positions(int layer, int kv_head, int64_t entry) const override;

  // Whether (layer, kv_head) keeps its full cache (valid once that layer was compressed).
  bool is_outlier(int layer, int kv_head) const;
  // The unlinked shares measured on the prompt for (layer, kv_head) (NaN with a profile).
  double unlinked_share(int layer, int kv_head) const;

 private:
  // The number of outlier heads over all layers (the profile's, or the prompt quota's total).
  int64_t outlier_head_count() const;
  // reallocate=1: lowers budget_ to what the other heads may keep; Error below `least`.
  void reallocate_outlier_cost(int64_t least);
  struct HeadState {
    bool merging = false;  // prefill compressed this head (an outlier head never merges)
    bool outlier = false;
    double unlinked_share = 0.0;
    // Members of cache entries [0, member_offsets.size() - 1); later entries (decoded since the
    // last compression) stand for their own position.
    std::vector<int64_t> member_offsets{0};
    std::vector<int32_t> members;
  };
  HeadState& state(int layer, int kv_head);
  const HeadState& state(int layer, int kv_head) const;
  // Writes `merged` into `cache` (log-weight = log(degree)) and keeps its members.
  static void store(MergedHead& merged, HeadCache& cache, HeadState& state);

  ChelseaOptions options_;
  SequenceInfo info_;
  int64_t budget_ = 0;
  std::vector<HeadState> heads_;  // [n_layers * n_kv_heads]
};

extern const PressEntry kChelseaEntry;

}  // namespace protokv::press
