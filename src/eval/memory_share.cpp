// SPDX-License-Identifier: Apache-2.0
#include "eval/memory_share.h"

#include <algorithm>
#include <cmath>

#include "press/entry.h"
#include "protokv/error.h"

namespace protokv::eval {

namespace {

// Whether the press stores exactly B entries per KV head in every layer at budget B.
bool stores_the_budget(const PressSpec& press, const ModelConfig& config) {
  if (config.has_local_layers()) return false;  // the local layers keep their window whatever B
  const press::PressEntry* entry = press::find_press_entry(press.name());
  return entry != nullptr && entry->compresses && !entry->recalls && !entry->merges &&
         !entry->shares_keys;
}

size_t stored_bytes(const ModelWeights& weights, const std::shared_ptr<const PressSpec>& press,
                    const PrefilledPrompt& prompt, int64_t budget) {
  SessionOptions options = prompt.options();
  options.press = press;
  options.budget.entries = budget;
  Session session(weights, options);
  session.prefill(prompt);
  return session.cache().kv_bytes();
}

}  // namespace

MemoryShareBudget solve_memory_share(const ModelWeights& weights,
                                     const std::shared_ptr<const PressSpec>& press,
                                     int64_t n_tokens,
                                     const std::function<const PrefilledPrompt&()>& prompt,
                                     double share, KvCacheType cache_type) {
  PROTOKV_CHECK(share > 0.0 && share <= 1.0, "memory share {} outside (0, 1]", share);
  PROTOKV_CHECK(press != nullptr, "a memory share needs a press");
  const int64_t n = n_tokens;
  MemoryShareBudget out;
  out.full_kv_bytes = full_kv_bytes(weights.config, n, cache_type);
  if (stores_the_budget(*press, weights.config)) {
    out.entries =
        std::clamp<int64_t>(static_cast<int64_t>(std::floor(share * static_cast<double>(n))), 1, n);
    return out;
  }
  // Two trial compressions: stored(B) = a + b * B.
  out.probed = true;
  const int64_t b1 = std::max<int64_t>(1, n / 2), b2 = std::max<int64_t>(b1 + 1, 3 * n / 4);
  PROTOKV_CHECK(b2 < n, "a prompt of {} tokens is too short to solve a memory share", n);
  const PrefilledPrompt& prefilled = prompt();
  PROTOKV_CHECK(prefilled.n_tokens() == n, "memory share: the prompt has {} tokens, not {}",
                prefilled.n_tokens(), n);
  PROTOKV_CHECK(prefilled.cache_type() == cache_type,
                "memory share: the prompt was prefilled into another KV cache type");
  const auto y1 = static_cast<double>(stored_bytes(weights, press, prefilled, b1));
  const auto y2 = static_cast<double>(stored_bytes(weights, press, prefilled, b2));
  const double full = static_cast<double>(out.full_kv_bytes);
  const double slope = (y2 - y1) / static_cast<double>(b2 - b1);
  const double fixed = y1 - slope * static_cast<double>(b1);
  if (slope <= 0.0)
    fail(
        "press {} stores {:.1f}% of the full cache at every budget: memory share {} is out of "
        "reach",
        press->text(), 100.0 * y1 / full, share);
  const double target = share * full;
  const double solved = std::floor((target - fixed) / slope);
  if (solved < 1.0)
    fail(
        "press {} stores at least {:.1f}% of the full cache (at budget 1): memory share {} is out "
        "of reach",
        press->text(), 100.0 * (fixed + slope) / full, share);
  out.entries = std::min<int64_t>(static_cast<int64_t>(solved), n);
  return out;
}

}  // namespace protokv::eval
