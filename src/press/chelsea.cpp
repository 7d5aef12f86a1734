// SPDX-License-Identifier: Apache-2.0
#include "press/chelsea.h"
#include "core/parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "protokv/error.h"
#include "protokv/press/options.h"
#include "protokv/press/scores.h"

namespace protokv::press {

double ChelseaSchedule::ratio(int step) const {
  // Appendix C; r <= 0.5 because a step can merge at most every A entry, half of the middle.
  // "r is manually restricted to exceed 0" (the qwen values reach 0 at i = m): the paper gives no
  // floor, so a schedule that reaches 0 stays at its last positive value.
  int decreases = std::min(steps, std::max(0, step));
  while (decreases > 0 && !(r_init - alpha * decreases > 0.0)) --decreases;
  return std::min(0.5, r_init - alpha * decreases);
}

ChelseaSchedule chelsea_schedule_preset(const std::string& name) {
  if (name == "llama2") return {0.45, 0.05, 3};
  if (name == "llama3") return {0.35, 0.1, 2};
  if (name == "qwen") return {0.2, 0.1, 2};
  fail("press 'chelsea': unknown schedule '{}' (llama2, llama3, qwen)", name);
}

namespace {

const std::vector<std::string_view> kScheduleNames = {"llama2", "llama3", "qwen"};

// "llama2 0.45/0.05/3, llama3 0.35/0.1/2, qwen 0.2/0.1/2", from the presets themselves.
std::string schedule_presets_text() {
  std::vector<std::string> items;
  for (std::string_view name : kScheduleNames) {
    const ChelseaSchedule s = chelsea_schedule_preset(std::string(name));
    items.push_back(fmt::format("{} {}/{}/{}", name, s.r_init, s.alpha, s.steps));
  }
  return fmt::format("{}", fmt::join(items, ", "));
}

}  // namespace

void MergedHead::append(const float* key, const float* value, int32_t position,
                        std::span<const int32_t> member_positions) {
  keys.insert(keys.end(), key, key + head_dim);
  values.insert(values.end(), value, value + head_dim);
  positions.push_back(position);
  members.insert(members.end(), member_positions.begin(), member_positions.end());
  member_offsets.push_back(static_cast<int64_t>(members.size()));
}

namespace {

// One Chunked Soft Matching step's plan (Chelsea §5.2-5.3) over keys [size, head_dim]: which
// A entries merge into which B entry.
struct MergePlan {
  int64_t count = 0;                      // links merged = entries removed
  std::vector<int64_t> into;              // [size]: the B entry an A entry merges into (-1: stays)
  std::vector<int64_t> incoming_offsets;  // [size + 1]: per B, its A entries (CSR, cache order)
  std::vector<int64_t> incoming;
};

void plan_merge_step(const float* keys, int64_t size, int d, const ChelseaLayout& layout,
                     double ratio, int64_t max_merges, MergePlan& plan) {
  plan.count = 0;
  const int64_t first = std::min(size, layout.sinks);
  const int64_t last = std::max(first, size - layout.recent);
  thread_local std::vector<SoftLink> links;
  links.clear();
  for (int64_t begin = first; begin < last; begin += layout.chunk)
    link_chunk(keys, d, begin, std::min(last, begin + layout.chunk), links);
  // r is the share of the middle merged away (ToMe's convention, which the paper's bound
  // 0 <= r <= 0.5 implies: merging every link removes every A, half of the middle).
  auto count = static_cast<int64_t>(std::floor(ratio * static_cast<double>(last - first)));
  count = std::min({count, max_merges, static_cast<int64_t>(links.size())});
  if (count < 1 && max_merges > 0 && !links.empty()) count = 1;  // always progress
  if (count < 1) return;
  // The `count` most similar links over all chunks (NaN ranks last; ties: the lower A first).
  const auto better = [](const SoftLink& x, const SoftLink& y) {
    const bool x_nan = std::isnan(x.similarity), y_nan = std::isnan(y.similarity);
    if (x_nan != y_nan) return y_nan;
    if (!x_nan && x.similarity != y.similarity) return x.similarity > y.similarity;
    return x.a < y.a;
  };
  std::partial_sort(links.begin(), links.begin() + count, links.end(), better);

  plan.count = count;
  plan.into.assign(static_cast<size_t>(size), -1);
  plan.incoming_offsets.assign(static_cast<size_t>(size) + 1, 0);
  for (int64_t i = 0; i < count; ++i) {
    const SoftLink& link = links[static_cast<size_t>(i)];
    plan.into[static_cast<size_t>(link.a)] = link.b;
    ++plan.incoming_offsets[static_cast<size_t>(link.b) + 1];
  }
  std::partial_sum(plan.incoming_offsets.begin(), plan.incoming_offsets.end(),
                   plan.incoming_offsets.begin());
  plan.incoming.assign(static_cast<size_t>(count), 0);
  thread_local std::vector<int64_t> fill;
  fill.assign(plan.incoming_offsets.begin(), plan.incoming_offsets.end() - 1);
  for (int64_t a = 0; a < size; ++a) {  // ascending: each B's A entries in cache order
    const int64_t b = plan.into[static_cast<size_t>(a)];
    if (b >= 0) plan.incoming[static_cast<size_t>(fill[static_cast<size_t>(b)]++)] = a;
  }
}

// Applies `plan` in place to rows held by `Rows` (MergedHead's vectors at prefill, the cache
// itself during decode, so that a decode re-run neither copies nor allocates the head) and to
// their member lists (CSR). Rows provides keys()/values() [size, d], compact(kept) (keeps rows
// `kept`, ascending, in place) and set_merged(row, key, value, degree).
template <class Rows>
void apply_merge_step(const MergePlan& plan, Rows& rows, int d,
                      std::vector<int64_t>& member_offsets, std::vector<int32_t>& members) {
  const auto size = static_cast<int64_t>(member_offsets.size()) - 1;
  thread_local std::vector<int32_t> kept, merged_rows;
  thread_local std::vector<int64_t> merged_degrees, next_offsets;
  thread_local std::vector<int32_t> next_members, merged_members;
  thread_local std::vector<float> merged_keys, merged_values;  // [merged rows, d]
  thread_local std::vector<double> key_sum, value_sum;
  kept.clear();
  merged_rows.clear();
  merged_degrees.clear();
  merged_keys.clear();
  merged_values.clear();
  next_offsets.assign(1, 0);
  next_members.clear();
  next_members.reserve(members.size());
  const auto degree = [&](int64_t x) {
    return member_offsets[static_cast<size_t>(x) + 1] - member_offsets[static_cast<size_t>(x)];
  };
  const auto members_of = [&](int64_t x) {
    return std::span<const int32_t>(members).subspan(
        static_cast<size_t>(member_offsets[static_cast<size_t>(x)]),
        static_cast<size_t>(degree(x)));
  };
  // The merged rows are computed from the rows as they are, before compaction overwrites any.
  const float* keys = rows.keys();
  const float* values = rows.values();
  for (int64_t e = 0; e < size; ++e) {
    if (plan.into[static_cast<size_t>(e)] >= 0) continue;  // merged into its B
    kept.push_back(static_cast<int32_t>(e));
    const int64_t in_begin = plan.incoming_offsets[static_cast<size_t>(e)];
    const int64_t in_end = plan.incoming_offsets[static_cast<size_t>(e) + 1];
    if (in_begin == in_end) {
      const auto m = members_of(e);
      next_members.insert(next_members.end(), m.begin(), m.end());
      next_offsets.push_back(static_cast<int64_t>(next_members.size()));
      continue;
    }
    // Paper 001 §5.3: k = sum n_t k_t / sum n_t (values alike), in double. Exact duplicates
    // give back their own key: n_1 k + n_2 k = (n_1 + n_2) k exactly in double.
    key_sum.assign(static_cast<size_t>(d), 0.0);
    value_sum.assign(static_cast<size_t>(d), 0.0);
    merged_members.clear();
    int64_t total = 0;
    const auto add = [&](int64_t x) {
      const auto weight = static_cast<double>(degree(x));
      const float* k = keys + x * d;
      const float* v = values + x * d;
      for (int c = 0; c < d; ++c) {
        key_sum[static_cast<size_t>(c)] += weight * k[c];
        value_sum[static_cast<size_t>(c)] += weight * v[c];
      }
      total += degree(x);
      const auto m = members_of(x);
      merged_members.insert(merged_members.end(), m.begin(), m.end());
    };
    add(e);
    for (int64_t i = in_begin; i < in_end; ++i) add(plan.incoming[static_cast<size_t>(i)]);
    for (int c = 0; c < d; ++c) {
      merged_keys.push_back(
          static_cast<float>(key_sum[static_cast<size_t>(c)] / static_cast<double>(total)));
      merged_values.push_back(
          static_cast<float>(value_sum[static_cast<size_t>(c)] / static_cast<double>(total)));
    }
    merged_rows.push_back(static_cast<int32_t>(kept.size()) - 1);
    merged_degrees.push_back(total);
    std::sort(merged_members.begin(), merged_members.end());
    next_members.insert(next_members.end(), merged_members.begin(), merged_members.end());
    next_offsets.push_back(static_cast<int64_t>(next_members.size()));
  }
  rows.compact(kept);
  for (size_t i = 0; i < merged_rows.size(); ++i)
    rows.set_merged(merged_rows[i], merged_keys.data() + i * static_cast<size_t>(d),
                    merged_values.data() + i * static_cast<size_t>(d), merged_degrees[i]);
  // Swapped, not copied: the previous lists become this thread's scratch for the next step.
  std::swap(members, next_members);
  std::swap(member_offsets, next_offsets);
}

// Chelsea Eq. 2: a merged entry's logit + log(n_t); 0 for an ordinary entry.
float log_weight_of(int64_t degree) {
  return degree > 1 ? static_cast<float>(std::log(static_cast<double>(degree))) : 0.0f;
}

// MergedHead's own vectors (prefill and the tests).
struct MergedHeadRows {
  MergedHead& head;
  const float* keys() const { return head.keys.data(); }
  const float* values() const { return head.values.data(); }
  void compact(std::span<const int32_t> kept) {
    const auto d = static_cast<size_t>(head.head_dim);
    for (size_t i = 0; i < kept.size(); ++i) {
      const auto src = static_cast<size_t>(kept[i]);
      if (src == i) continue;
      std::memcpy(head.keys.data() + i * d, head.keys.data() + src * d, d * sizeof(float));
      std::memcpy(head.values.data() + i * d, head.values.data() + src * d, d * sizeof(float));
      head.positions[i] = head.positions[src];
    }
    head.keys.resize(kept.size() * d);
    head.values.resize(kept.size() * d);
    head.positions.resize(kept.size());
  }
  void set_merged(int64_t row, const float* key, const float* value, int64_t /*degree*/) {
    std::copy(key, key + head.head_dim, head.keys.data() + row * head.head_dim);
    std::copy(value, value + head.head_dim, head.values.data() + row * head.head_dim);
  }
};

// A cache head during decode: merged in place, log-weights kept current (Eq. 2).
// An F32 cache's rows are read in place; a quantised cache's are read as F32 copies (the merge
// means are computed from what the cache holds, and written back in its type).
struct HeadCacheRows {
  HeadCache& head;
  std::vector<float> key_copy = {}, value_copy = {};
  const float* keys() { return head.keys_as_f32(0, head.size(), key_copy); }
  const float* values() { return head.values_as_f32(0, head.size(), value_copy); }
  void compact(std::span<const int32_t> kept) { head.compact(kept); }
  void set_merged(int64_t row, const float* key, const float* value, int64_t degree) {
    head.write_key(row, key);
    head.write_value(row, value);
    head.set_log_weight(row, log_weight_of(degree));
  }
};

template <class Rows>
int64_t merge_step(Rows& rows, int64_t size, int d, std::vector<int64_t>& member_offsets,
                   std::vector<int32_t>& members, const ChelseaLayout& layout, double ratio,
                   int64_t max_merges) {
  thread_local MergePlan plan;
  plan_merge_step(rows.keys(), size, d, layout, ratio, max_merges, plan);
  if (plan.count > 0) apply_merge_step(plan, rows, d, member_offsets, members);
  return plan.count;
}

}  // namespace

int64_t chelsea_merge_step(MergedHead& head, const ChelseaLayout& layout, double ratio,
                           int64_t max_merges) {
  MergedHeadRows rows{head};
  return merge_step(rows, head.size(), head.head_dim, head.member_offsets, head.members, layout,
                    ratio, max_merges);
}

void chelsea_compress(MergedHead& head, const ChelseaLayout& layout,
                      const ChelseaSchedule& schedule, int64_t budget) {
  for (int step = 0; head.size() > budget; ++step)
    if (chelsea_merge_step(head, layout, schedule.ratio(step), head.size() - budget) == 0) break;
}

nlohmann::json ChelseaPress::config() const {
  nlohmann::json out;
  out["name"] = "chelsea";
  out["sinks"] = options_.layout.sinks;
  out["recent"] = options_.layout.recent;
  out["chunk"] = options_.layout.chunk;
  out["interval"] = options_.interval;
  out["schedule"] = options_.schedule_name;
  out["r_init"] = options_.schedule.r_init;
  out["alpha"] = options_.schedule.alpha;
  out["steps"] = options_.schedule.steps;
  out["outliers"] = options_.outliers;
  out["threshold"] = options_.threshold;
  out["reallocate"] = options_.reallocate;
  out["outlier_source"] = options_.outlier_heads.has_value() ? "profile"
                          : options_.outliers > 0.0          ? "prompt, per layer"
                                                             : "none";
  if (options_.outlier_heads.has_value()) out["outlier_heads"] = *options_.outlier_heads;
  if (!options_.profile_path.empty()) out["profile"] = options_.profile_path;
  out["training_free"] = true;
  return out;
}

void ChelseaPress::begin(const SequenceInfo& info, const Budget& budget) {
  info_ = info;
  budget_ = budget.resolve(info.n_tokens);
  const int64_t least = options_.layout.sinks + options_.layout.recent + 1;
  if (budget_ < info.n_tokens && budget_ < least)
    fail(
        "press 'chelsea': budget {} leaves no room beside its {} sinks and {} recent entries "
        "(needs at least {})",
        budget_, options_.layout.sinks, options_.layout.recent, least);
  if (options_.profile != nullptr) check_profile_matches(*options_.profile, info, "chelsea");
  if (options_.outlier_heads.has_value()) {
    const auto& mask = *options_.outlier_heads;
    bool fits = static_cast<int>(mask.size()) == info.n_layers;
    for (const auto& layer : mask) fits = fits && static_cast<int>(layer.size()) == info.n_kv_heads;
    if (!fits)
      fail("press 'chelsea': the outlier-head mask is not {} layers x {} KV heads", info.n_layers,
           info.n_kv_heads);
  }
  heads_.assign(static_cast<size_t>(std::max(0, info.n_layers) * std::max(0, info.n_kv_heads)),
                HeadState{});
  if (options_.reallocate && budget_ < info.n_tokens) reallocate_outlier_cost(least);
}

int64_t ChelseaPress::outlier_head_count() const {
  if (options_.outlier_heads.has_value()) {
    int64_t count = 0;
    for (const auto& layer : *options_.outlier_heads)
      count += std::count_if(layer.begin(), layer.end(), [](uint8_t x) { return x != 0; });
    return count;
  }
  // The running quota of compress_prefill ends at this many heads over all layers.
  return std::llround(options_.outliers * static_cast<double>(info_.n_layers) * info_.n_kv_heads);
}

void ChelseaPress::reallocate_outlier_cost(int64_t least) {
  // Chelsea App. C.2: all heads together hold heads x B entries; the K outlier heads hold n each,
  // the others share the rest.
  const int64_t heads = static_cast<int64_t>(info_.n_layers) * info_.n_kv_heads;
  const int64_t outliers = outlier_head_count();
  if (outliers == 0 || outliers >= heads) return;
  const int64_t others = heads - outliers;
  const int64_t spare = heads * budget_ - outliers * info_.n_tokens;
  const int64_t per_head = spare >= 0 ? spare / others : -1;
  if (per_head < least) {
    const int64_t needed = (outliers * info_.n_tokens + others * least + heads - 1) / heads;
    fail(
        "press 'chelsea': paying the full caches of its {} outlier heads out of the budget "
        "(reallocate=1, Chelsea App. C.2) leaves {} entries per other head, below its {} sinks + "
        "{} recent + 1: give a budget of at least {} for this {}-token prompt, or reallocate=0",
        outliers, std::max<int64_t>(per_head, 0), options_.layout.sinks, options_.layout.recent,
        needed, info_.n_tokens);
  }
  budget_ = per_head;
}

ChelseaPress::HeadState& ChelseaPress::state(int layer, int kv_head) {
  return const_cast<HeadState&>(std::as_const(*this).state(layer, kv_head));
}
const ChelseaPress::HeadState& ChelseaPress::state(int layer, int kv_head) const {
  // A caller driving the press directly may hand it a layer of another shape than begin() was
  // told: one error line, not another head's state.
  if (layer < 0 || layer >= info_.n_layers || kv_head < 0 || kv_head >= info_.n_kv_heads)
    fail(
        "press 'chelsea': layer {} KV head {} is outside the {} layers x {} KV heads it began with",
        layer, kv_head, info_.n_layers, info_.n_kv_heads);
  return heads_[static_cast<size_t>(layer * info_.n_kv_heads + kv_head)];
}

bool ChelseaPress::is_outlier(int layer, int kv_head) const {
  return state(layer, kv_head).outlier;
}
double ChelseaPress::unlinked_share(int layer, int kv_head) const {
  return state(layer, kv_head).unlinked_share;
}

void ChelseaPress::store(MergedHead& merged, HeadCache& cache, HeadState& state) {
  const int d = merged.head_dim;
  cache.clear();
  cache.reserve(merged.size());
  for (int64_t e = 0; e < merged.size(); ++e) {
    cache.append(merged.keys.data() + e * d, merged.values.data() + e * d,
                 merged.positions[static_cast<size_t>(e)], log_weight_of(merged.degree(e)));
  }
  state.member_offsets = std::move(merged.member_offsets);
  state.members = std::move(merged.members);
}

void ChelseaPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  const int64_t n = layer.n_tokens;
  const int n_kv = layer.n_kv_heads;
  const int d = layer.head_dim;
  // Outlier heads (Chelsea §5.4): from the profile, or measured on this prompt as the layers
  // arrive. A global ranking needs every layer, but each layer's cache is written now; so after
  // layer l, round(outliers * heads of layers 0..l) heads are outliers in total, and layer l adds
  // the difference: its heads of highest unlinked share (ties: the lower head).
  std::vector<uint8_t> outlier(static_cast<size_t>(n_kv), 0);
  if (options_.outlier_heads.has_value()) {
    for (int h = 0; h < n_kv; ++h) {
      outlier[static_cast<size_t>(h)] =
          (*options_.outlier_heads)[static_cast<size_t>(layer.layer)][static_cast<size_t>(h)] != 0;
      state(layer.layer, h).unlinked_share = std::numeric_limits<double>::quiet_NaN();
    }
  } else if (options_.outliers > 0.0) {
    const auto quota = [&](int layers) {
      return std::llround(options_.outliers * static_cast<double>(layers) * n_kv);
    };
    const int64_t wanted = quota(layer.layer + 1) - quota(layer.layer);
    std::vector<int> order(static_cast<size_t>(n_kv));
    for (int h = 0; h < n_kv; ++h) {
      state(layer.layer, h).unlinked_share =
          chelsea_unlinked_share(layer.k_head(h), n, d, options_.layout, options_.threshold);
      order[static_cast<size_t>(h)] = h;
    }
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return state(layer.layer, x).unlinked_share > state(layer.layer, y).unlinked_share;
    });
    for (int64_t i = 0; i < std::min<int64_t>(wanted, n_kv); ++i)
      outlier[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  }

  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < n_kv; ++h) {
    errors.run([&] {
      HeadState& s = state(layer.layer, h);
      HeadCache& cache = out.heads[static_cast<size_t>(h)];
      s.outlier = outlier[static_cast<size_t>(h)] != 0;
      MergedHead merged;
      merged.head_dim = d;
      merged.keys.assign(layer.k_head(h), layer.k_head(h) + n * d);
      merged.values.assign(layer.v_head(h), layer.v_head(h) + n * d);
      merged.positions.assign(layer.positions, layer.positions + n);
      merged.members = merged.positions;
      merged.member_offsets.resize(static_cast<size_t>(n) + 1);
      std::iota(merged.member_offsets.begin(), merged.member_offsets.end(), int64_t{0});
      if (!s.outlier) chelsea_compress(merged, options_.layout, options_.schedule, budget_);
      s.merging = !s.outlier && n > budget_;  // only a compressed prefill merges during decode
      store(merged, cache, s);
    });
  }
  errors.rethrow();
}

void ChelseaPress::on_decode(const DecodeStep& step) {
  const int layer = step.layer;
  if (layer < 0 || static_cast<size_t>((layer + 1) * info_.n_kv_heads) > heads_.size()) return;
  LayerCache& cache = *step.cache;
  const int n_kv = static_cast<int>(cache.heads.size());
  // Algorithm 1: once a head holds B + g entries, Chelsea compresses it back to B. The heads of a
  // layer reach it at the same step; each head's work is independent.
  const bool parallel =
      (budget_ + options_.interval) * info_.head_dim * n_kv >= kParallelMinElements;
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int h = 0; h < n_kv; ++h) {
    errors.run([&] {
      HeadState& s = state(layer, h);
      HeadCache& head = cache.heads[static_cast<size_t>(h)];
      if (!s.merging || head.size() < budget_ + options_.interval) return;
      for (int64_t e = static_cast<int64_t>(s.member_offsets.size()) - 1; e < head.size(); ++e) {
        s.members.push_back(head.positions()[static_cast<size_t>(e)]);  // decoded: itself
        s.member_offsets.push_back(static_cast<int64_t>(s.members.size()));
      }
      // In place: the head keeps its capacity for the next B + interval entries.
      HeadCacheRows rows{head};
      for (int i = 0; head.size() > budget_; ++i)
        if (merge_step(rows, head.size(), head.head_dim(), s.member_offsets, s.members,
                       options_.layout, options_.schedule.ratio(i), head.size() - budget_) == 0)
          break;
    });
  }
  errors.rethrow();
}

std::span<const int32_t> ChelseaPress::merged_positions(int layer, int kv_head,
                                                        int64_t entry) const {
  if (layer < 0 || kv_head < 0 || kv_head >= info_.n_kv_heads ||
      static_cast<size_t>(layer * info_.n_kv_heads + kv_head) >= heads_.size())
    return {};
  const HeadState& s = state(layer, kv_head);
  if (entry < 0 || entry + 1 >= static_cast<int64_t>(s.member_offsets.size())) return {};
  const int64_t begin = s.member_offsets[static_cast<size_t>(entry)];
  const int64_t end = s.member_offsets[static_cast<size_t>(entry) + 1];
  if (end - begin < 2) return {};
  return std::span<const int32_t>(s.members).subspan(static_cast<size_t>(begin),
                                                     static_cast<size_t>(end - begin));
}

const PressEntry kChelseaEntry{
    .name = "chelsea",
    .allocator_role = AllocatorRole::None,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "training-free, merging (Chelsea): per KV head keeps `sinks` first and `recent`\n"
              "last entries; the middle, in chunks of `chunk`, is merged by Chunked Soft\n"
              "Matching: odd offsets (A) link to their most cosine-similar even offset (B) of\n"
              "the chunk; the top r share of the middle's links (r = r_init - alpha*min(m, i)\n"
              "at step i, from `schedule`)\n"
              "merge each B with its A into one entry: degree-weighted mean key and value,\n"
              "degree = sum, logit + log(degree) (Eq. 2); steps repeat until the head holds B\n"
              "entries (at least sinks + recent + 1), and during decode each time it reaches\n"
              "B + `interval` (the paper gives no g). `outliers` (share of heads) keep the full\n"
              "cache: without a profile, measured on the prompt (share of A with link\n"
              "similarity < `threshold`) as layers arrive, a running quota per layer (an\n"
              "approximation of the paper's global ranking); `profile=FILE` (from protokv\n"
              "calibrate) takes the profile's outlier heads, ranked over all heads instead.\n"
              "reallocate=1 (App. C.2): the outlier heads' full caches come out of the other\n"
              "heads' budgets, so that all heads hold layers x heads x B entries in total (an\n"
              "error when too little is left; reallocate=0: B per other head, outliers on top).\n");
        },
    .options =
        [] {
          constexpr int64_t kLarge = int64_t{1} << 30;
          const ChelseaOptions o;
          return std::vector<OptionSpec>{
              int_option("sinks", o.layout.sinks, 0, kLarge, "the first entries, never merged"),
              int_option("recent", o.layout.recent, 0, kLarge, "the last entries, never merged"),
              int_option("chunk", o.layout.chunk, 2, kLarge,
                         "chunk length of Chunked Soft Matching", "Chelsea §5.2"),
              int_option("interval", o.interval, 1, kLarge,
                         "decode compresses a head back to B when it reaches B + interval (the "
                         "paper gives no g)",
                         "Chelsea Algorithm 1"),
              choice_option("schedule", o.schedule_name, kScheduleNames,
                            "the paper's merge-ratio presets (r_init/alpha/steps): " +
                                schedule_presets_text(),
                            "Chelsea Appendix C"),
              derived(double_option("r_init", 0.0, 0.0, 0.5, "first step's merge ratio (> 0)"),
                      "schedule's"),
              derived(double_option("alpha", 0.0, 0.0, 0.5, "ratio decrease per step"),
                      "schedule's"),
              derived(int_option("steps", 0, 0, 1000, "steps m after which r stops decreasing"),
                      "schedule's"),
              text_option("profile",
                          "a calibration profile (protokv calibrate) whose outlier heads, ranked "
                          "over all heads, are used instead of measuring on the prompt"),
              double_option("outliers", o.outliers, 0.0, 1.0,
                            "share of heads that keep the full cache"),
              double_option("threshold", o.threshold, -1.0, 1.0,
                            "link similarity below which an A counts as unlinked (outlier "
                            "measure)"),
              bool_option("reallocate", o.reallocate,
                          "the outlier heads' full caches come out of the other heads' budgets",
                          "Chelsea Appendix C.2"),
          };
        },
    .make = [](const PressEntry&, OptionReader& options,
               const AllocatorConfig&) -> std::unique_ptr<Press> {
      ChelseaOptions o;
      o.layout.sinks = options.get_int("sinks");
      o.layout.recent = options.get_int("recent");
      o.layout.chunk = options.get_int("chunk");
      o.interval = options.get_int("interval");
      o.schedule_name = options.get_choice("schedule");
      const ChelseaSchedule preset = chelsea_schedule_preset(o.schedule_name);
      o.schedule.r_init = options.get_double("r_init", preset.r_init);
      o.schedule.alpha = options.get_double("alpha", preset.alpha);
      o.schedule.steps = static_cast<int>(options.get_int("steps", preset.steps));
      if (!(o.schedule.r_init > 0.0)) fail("press 'chelsea': r_init must be > 0 (got 0)");
      o.profile_path = options.get_text("profile");
      // The profile's outlier heads were ranked over every head at its own threshold/fraction.
      o.profile = profile_option(options, {"outliers", "threshold"});
      if (o.profile != nullptr) {
        // The outlier heads were measured with the profile's sinks / recent / chunk layout (the
        // link similarities depend on how A and B are cut): another layout here would use heads
        // ranked on other matches.
        const ChelseaLayout& p = o.profile->chelsea_layout;
        if (p.sinks != o.layout.sinks || p.recent != o.layout.recent || p.chunk != o.layout.chunk)
          fail(
              "press 'chelsea': profile {} was calibrated with sinks={} recent={} chunk={}, this "
              "press has sinks={} recent={} chunk={}: give the profile's layout or calibrate "
              "with this one",
              o.profile_path, p.sinks, p.recent, p.chunk, o.layout.sinks, o.layout.recent,
              o.layout.chunk);
        o.outlier_heads = o.profile->chelsea_outlier;
      }
      o.outliers = options.get_double("outliers");
      o.threshold = options.get_double("threshold");
      o.reallocate = options.get_bool("reallocate");
      return std::make_unique<ChelseaPress>(std::move(o));
    },
    .merges = true,
};

}  // namespace protokv::press
